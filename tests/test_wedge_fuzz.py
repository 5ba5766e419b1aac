"""Fuzz: workflow inputs sent straight through the Temporal client, as anyone who can reach
Temporal may send them. Each one either runs (its first workflow task completes) or fails
promptly with a message; none stays Running with failed workflow tasks. Bounded: a fixed number
of examples, each given 30 s, on one real stack."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from temporalio.api.enums.v1 import EventType

from contracts.control import CONTROL_QUEUE
from gpuflow import ops
from tests.live import FAST, Live, cli, spec

EXAMPLES = 30
# 100 GiB per replica on a 24 GiB host: a valid input waits PENDING and starts no process
BIG = spec("fz", vram_gib=100).model_dump(mode="json", exclude_none=True)
VALID = {
    "ModelDeploymentWorkflow": {"spec": BIG, "timings": FAST.model_dump(), "replicas": 1},
    "ModelInstanceWorkflow": {"name": "fz-i", "deployment": "fz", "spec": BIG, "timings": FAST.model_dump()},
    "HostWorkflow": {"name": "fzh", "timings": FAST.model_dump()},
}
PREFIX = {"ModelDeploymentWorkflow": "deployment", "ModelInstanceWorkflow": "instance", "HostWorkflow": "host"}

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.integers(-3, 5000),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12))
values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids,
                                                                                          max_size=3), max_leaves=6)


@st.composite
def inputs(draw) -> tuple[str, list]:
    wtype = draw(st.sampled_from(sorted(VALID)))
    base = json.loads(json.dumps(VALID[wtype]))
    how = draw(st.sampled_from(["field", "field", "field", "spec", "spec", "drop", "whole", "count"]))
    if how == "whole":
        return wtype, [draw(values)]
    if how == "count":
        return wtype, [base] * draw(st.sampled_from([0, 2, 3]))
    target = base["spec"] if how == "spec" and "spec" in base else base
    key = draw(st.sampled_from(sorted(target) + ["replicas", "timings", "name", "extra"]))
    if how == "drop":
        target.pop(key, None)
    else:
        target[key] = draw(values)
    return wtype, [base]


def drawn(n: int) -> list[tuple[str, list]]:
    out: list = []

    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(inputs())
    def collect(x):
        out.append(x)

    collect()
    return out


async def _outcome(lv: Live, wid: str, within: float = 30) -> str:
    """'failed: <message>', 'closed: <status>' or 'running' (its first task completed)."""
    h = lv.client.get_workflow_handle(wid)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        d = await h.describe()
        if d.status is not None and d.status.name != "RUNNING":
            if d.status.name == "FAILED":
                try:
                    await h.result()
                except Exception as e:  # noqa: BLE001
                    return f"failed: {getattr(e, 'cause', None) or e}"
            return f"closed: {d.status.name}"
        kinds = {e.event_type for e in (await h.fetch_history()).events}
        if EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED in kinds:
            return "task failed"
        if EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED in kinds:
            return "running"
        await asyncio.sleep(0.3)
    return "stuck"


async def _clean_up(lv: Live) -> None:
    """Stop what the valid inputs started (their instances end through their own teardown)."""
    async for w in lv.client.list_workflows("ExecutionStatus = 'Running'"):
        if w.id.startswith("instance/") and w.id != "instance/good-0":
            await lv.client.get_workflow_handle(w.id).signal("stop")
    for _ in range(100):
        left = [w.id async for w in lv.client.list_workflows(
            "ExecutionStatus = 'Running' AND WorkflowType = 'ModelInstanceWorkflow'") if w.id != "instance/good-0"]
        if not left:
            break
        await asyncio.sleep(0.5)
    async for w in lv.client.list_workflows("ExecutionStatus = 'Running'"):
        if w.id.startswith(("deployment/fz", "host/fz", "logs/fz", "instance/")) and w.id != "instance/good-0":
            await lv.client.get_workflow_handle(w.id).terminate("fuzz test over")


async def test_fuzzed_workflow_inputs_run_or_fail_promptly(tmp_path):
    lv = await Live(str(tmp_path)).start({"h1": [24]})
    try:
        await ops.deploy(lv.client, spec("good", vram_gib=4), FAST)
        await lv.wait(lambda: lv.states("good") == {"good-0": "running"}, 90, "good RUNNING")
        seen: dict[str, int] = {}
        for n, (wtype, args) in enumerate(drawn(EXAMPLES)):
            wid = f"{PREFIX[wtype]}/fz{n}"
            try:
                await lv.client.start_workflow(wtype, args=args, id=wid, task_queue=CONTROL_QUEUE)
            except Exception as e:  # noqa: BLE001  the client itself could not send it (not JSON)
                seen["unsendable"] = seen.get("unsendable", 0) + 1
                continue
            got = await _outcome(lv, wid)
            assert got == "running" or got.startswith(("failed: ", "closed: ")), (wid, wtype, args, got)
            if got.startswith("failed: "):
                assert len(got) > len("failed: ") + 10, got  # a message that says something
            seen[got.split(":")[0]] = seen.get(got.split(":")[0], 0) + 1
        print("fuzz outcomes:", seen)
        assert sum(seen.values()) == EXAMPLES
        await _clean_up(lv)
        out = cli(lv, "status", "--json")
        assert out.returncode == 0, out.stderr
        rows = {d["name"]: d for d in json.loads(out.stdout)["deployments"]}
        assert rows["good"]["instances"][0]["state"] == "running", rows
    finally:
        lv.close()
