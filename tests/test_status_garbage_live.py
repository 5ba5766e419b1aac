"""Workflows that failed at their input never slow a listing (issue 24): with ten workflows of every
kind started through Temporal with garbage inputs (as the Temporal CLI or any SDK can), some of
them under the ids of real deployments' autoscalers, ``gpuflow status`` lists the healthy
deployments and answers within twice its time without them. Before, a failed
``autoscaler/NAME`` was queried like a running one, and each such query took about 30 s to give up
(34 s instead of 2.5 s per ``gpuflow status``)."""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue

from contracts.control import CONTROL_QUEUE
from gpuflow import ops
from tests.live import FAST, Live, cli, spec

FLOOR_S = 2.0  # the baseline's floor: on a loaded 2-core machine one status run takes 1.5 to 4 s
# an input no data converter can decode: the workflow task fails on every attempt (Running, broken)
UNDECODABLE = RawValue(Payload(metadata={"encoding": b"binary/garbage"}, data=b"\x00\xff\xfe"))

# (workflow type, id, arguments): 10 garbage workflows, every kind, named after live deployments where
# that is what a listing would ask
GARBAGE = [
    ("AutoscalerWorkflow", "autoscaler/good", ["garbage"]),
    ("AutoscalerWorkflow", "autoscaler/spare", [{"deployment": 7}]),
    ("AutoscalerWorkflow", "autoscaler/idle", [UNDECODABLE]),
    ("AutoscalerWorkflow", "autoscaler/nothing", [[1, 2]]),
    ("ModelDeploymentWorkflow", "deployment/junk", [{"spec": "x"}]),
    ("ModelDeploymentWorkflow", "deployment/junk2", [None]),
    ("ModelInstanceWorkflow", "instance/good-7", [[]]),
    ("ModelInstanceWorkflow", "instance/junk-0", [{"name": "junk-0", "restarts": "x"}]),
    ("HostWorkflow", "host/junk", [7]),
    ("HostWorkflow", "host/junk2", [{"name": "junk2", "report": {"name": "junk2", "ram_total": "lots"}}]),
]


def status(lv: Live, *args: str, timeout: float = 180) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "gpuflow", "status", *args, "--address", lv.stack.temporal.address],
                       capture_output=True, text=True, timeout=timeout)
    return time.monotonic() - started, p


@pytest.fixture(scope="module")
async def stack(tmp_path_factory):
    lv = await Live(str(tmp_path_factory.mktemp("garbage"))).start({"h1": [24]})
    await ops.deploy(lv.client, spec("good", vram_gib=1), FAST)
    for name in ("spare", "idle"):  # listed, with no instance to ask about
        await ops.deploy(lv.client, spec(name, vram_gib=1, replicas=0), FAST)
    await lv.wait(lambda: lv.states("good") == {"good-0": "running"}, 90, "good RUNNING")
    yield lv
    lv.close()


async def _settled(lv: Live, wid: str, within: float = 30) -> str:
    """The workflow's status once its input was refused: FAILED, or Running with its workflow task
    failing (the undecodable input)."""
    h = lv.client.get_workflow_handle(wid)
    deadline = time.monotonic() + within
    while True:
        d = await h.describe()
        st = d.status.name if d.status else "?"
        if st != "RUNNING":
            return st
        if d.raw_description.HasField("pending_workflow_task") and d.raw_description.pending_workflow_task.attempt >= 2:
            return "RUNNING, its task failing"
        assert time.monotonic() < deadline, f"{wid} neither failed nor broke within {within} s"
        await asyncio.sleep(0.3)


async def test_status_stays_within_twice_its_time_with_ten_garbage_workflows(stack):
    lv = stack
    base_runs = []
    for _ in range(3):
        took, p = status(lv)
        assert p.returncode == 0, p.stderr
        assert "good-0" in p.stdout, p.stdout
        base_runs.append(took)
    base = statistics.median(base_runs)

    for wtype, wid, args in GARBAGE:
        await lv.client.start_workflow(wtype, args=args, id=wid, task_queue=CONTROL_QUEUE)
    settled = {wid: await _settled(lv, wid) for _, wid, _ in GARBAGE}
    assert settled["autoscaler/good"] == "FAILED" and settled["autoscaler/idle"] == "RUNNING, its task failing", settled

    bound = 2 * max(base, FLOOR_S)
    runs = []
    for _ in range(3):  # the best of three: one run slowed by another test's load is not the code's
        took, p = status(lv)
        runs.append(took)
        assert p.returncode == 0, p.stderr
        if took <= bound or took > 5 * bound:
            break
    print(f"gpuflow status: {', '.join(f'{t:.2f}' for t in base_runs)} s without, "
          f"{', '.join(f'{t:.2f}' for t in runs)} s with {len(GARBAGE)} garbage workflows (bound {bound:.2f} s)")
    assert min(runs) <= bound, (base_runs, runs, bound)
    out = p.stdout
    assert "good-0" in out and "running" in out.lower(), out
    assert "autoscaler good: BROKEN: failed: AutoscalerWorkflow" in out, out
    assert "autoscaler idle: BROKEN: its workflow task has failed" in out, out

    took, p = status(lv, "--json")
    assert p.returncode == 0, p.stderr
    rows = {d["name"]: d for d in json.loads(p.stdout)["deployments"]}
    assert set(rows) == {"good", "spare", "idle"}, rows  # the failed deployments are not listed
    assert rows["good"]["instances"][0]["state"] == "running"
    assert "got a string" in rows["good"]["autoscaler"]["broken"], rows["good"]
    assert rows["spare"]["autoscaler"]["broken"].startswith("failed: "), rows["spare"]
    assert "junk" not in [h["name"] for h in json.loads(p.stdout)["hosts"]]
    assert took <= 2 * bound, took
    for name, said in (("good", "failed: AutoscalerWorkflow"), ("idle", "its workflow task has failed")):
        t0 = time.monotonic()  # `gpuflow autoscale NAME` says so at once, too, exit 2
        p = cli(lv, "autoscale", name)
        assert p.returncode == 2 and said in p.stderr and time.monotonic() - t0 < 15, (p.stdout, p.stderr)

    await lv.client.get_workflow_handle("autoscaler/idle").terminate("test over")
