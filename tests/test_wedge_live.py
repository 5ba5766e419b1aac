"""One bad input must not wedge the cluster: workflow inputs sent straight through the Temporal
client (as the Temporal CLI or any SDK can) fail their workflow at once with the reason, while
a healthy deployment keeps running and ``gpuflow status`` / ``hosts`` keep answering."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError

from activities.payloads import CONTROL_QUEUE
from gpuflow import ops
from tests.live import FAST, Live, cli, spec

GOOD = spec("x", vram_gib=1).model_dump(mode="json", exclude_none=True)


def _with(**kw) -> dict:
    return {"spec": {**GOOD, **kw.pop("spec", {})}, "timings": FAST.model_dump(), **kw}


# (workflow type, input (a tuple: the arguments), what the failure names)
WEDGES = [
    ("ModelDeploymentWorkflow", ({**_with(), "replicas": "many"},), "replicas"),
    ("ModelDeploymentWorkflow", ([1, 2],), "got a list"),
    ("ModelDeploymentWorkflow", (None,), "got null"),
    ("ModelDeploymentWorkflow", ("deploy me",), "got a string"),
    ("ModelDeploymentWorkflow", (), "takes one input"),
    ("ModelDeploymentWorkflow", (_with(), _with()), "got 2"),
    ("ModelDeploymentWorkflow", (_with(spec={"replicas": 100000}),), "replicas"),
    ("ModelDeploymentWorkflow", ({**_with(), "replicas": 100000},), "replicas"),
    ("ModelDeploymentWorkflow", ({**_with(), "timings": {"reconcile_s": 1e300}},), "reconcile_s"),
    ("ModelDeploymentWorkflow", (_with(spec={"resources": {"vram": 2**80}}),), "vram"),
    ("ModelInstanceWorkflow", ({"name": "i", "deployment": "d", "spec": GOOD, "restarts": "x"},), "restarts"),
    ("ModelInstanceWorkflow", ([],), "got a list"),
    ("HostWorkflow", ({"name": "h9", "report": {"name": "h9", "ram_total": "lots"}},), "ram_total"),
    ("HostWorkflow", (7,), "got a int"),
    ("LogReadWorkflow", ({"instance": "i"},), "worker"),
]


async def _failure(lv: Live, wtype: str, args: tuple, wid: str, within: float = 30) -> str:
    """The failure message of a workflow started with ``args``; fails the test if it is still
    Running after ``within`` seconds or its history shows a failed workflow task."""
    h = await lv.client.start_workflow(wtype, args=list(args), id=wid, task_queue=CONTROL_QUEUE)
    try:
        await asyncio.wait_for(h.result(), within)
    except WorkflowFailureError as e:
        return str(e.cause)
    except asyncio.TimeoutError:
        hist = await h.fetch_history()
        failed = [e for e in hist.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
        await h.terminate("test: wedged")
        raise AssertionError(f"{wid} still Running after {within} s ({len(failed)} workflow task failures)")
    raise AssertionError(f"{wid} completed with input {args!r}")


@pytest.fixture(scope="module")
async def stack(tmp_path_factory):
    lv = await Live(str(tmp_path_factory.mktemp("wedge"))).start({"h1": [24]})
    await ops.deploy(lv.client, spec("good", vram_gib=4), FAST)
    await lv.wait(lambda: lv.states("good") == {"good-0": "running"}, 90, "good RUNNING")
    yield lv
    lv.close()


async def test_wedging_inputs_fail_at_once_and_status_keeps_answering(stack):
    lv = stack
    for n, (wtype, args, named) in enumerate(WEDGES):
        prefix = {"ModelDeploymentWorkflow": "deployment", "ModelInstanceWorkflow": "instance",
                  "HostWorkflow": "host", "LogReadWorkflow": "logs"}[wtype]
        msg = await _failure(lv, wtype, args, f"{prefix}/wedge{n}")
        assert named in msg, (wtype, args, msg)
    out = cli(lv, "status", "--json")
    assert out.returncode == 0, out.stderr
    st_ = json.loads(out.stdout)
    assert [d["name"] for d in st_["deployments"]] == ["good"]
    assert st_["deployments"][0]["instances"][0]["state"] == "running"
    assert [h["name"] for h in st_["hosts"]] == ["h1"]
    assert lv.states("good") == {"good-0": "running"}


async def test_status_hosts_and_delete_carry_on_past_a_broken_deployment(stack):
    """A deployment nobody runs (started on a task queue no worker polls, as a typo in
    `temporal workflow start --task-queue` does) never answers: status shows it BROKEN and the
    healthy one as it is; delete ends it at once instead of waiting on an update forever."""
    lv = stack
    await lv.client.start_workflow("ModelDeploymentWorkflow", _with(), id="deployment/nobody",
                                   task_queue="gpuflow-contrl")
    out = cli(lv, "status")
    assert out.returncode == 0, out.stderr
    assert "deployment nobody: BROKEN" in out.stdout and "good-0" in out.stdout, out.stdout
    out = cli(lv, "status", "--json")
    rows = {d["name"]: d for d in json.loads(out.stdout)["deployments"]}
    assert rows["good"]["instances"][0]["state"] == "running" and "task queue 'gpuflow-contrl'" in rows["nobody"]["broken"]
    out = cli(lv, "hosts")
    assert out.returncode == 0 and "h1" in out.stdout, out.stderr
    started = time.monotonic()
    out = cli(lv, "delete", "nobody")
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - started < 40
    out = cli(lv, "status", "--json")
    assert [d["name"] for d in json.loads(out.stdout)["deployments"]] == ["good"]
