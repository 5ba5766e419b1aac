"""The cluster's reads write nothing (issue 34): ``gpuflow queue``, ``keys list``, ``keys usage``,
``tenants``, what ``status`` adds and ``explain --history`` are queries of the reads workflow
(workflows/cluster_reads.py), answered by the control-plane worker from the store. Counted on a
real stack: each read added 6 events to the cluster workflow's history before (an update answered
by a local activity: accepted, a workflow task scheduled, started and completed, the activity's
marker, completed), and adds none now, to any workflow; nor does it start one."""

from __future__ import annotations

import asyncio
import json

from contracts.control import InstanceRecord
from store import records
from tests.live import FAST, Live, cli, spec

T = FAST.model_copy(update={"pending_recheck_s": 900, "reconcile_s": 60})  # nothing ticks while the reads are counted


async def histories(lv: Live) -> dict[str, list[str]]:
    """Every workflow in the namespace: "id/run" -> its history's event types."""
    out = {}
    async for w in lv.client.list_workflows():
        h = await lv.client.get_workflow_handle(w.id, run_id=w.run_id).fetch_history()
        out[f"{w.id}/{w.run_id}"] = [e.WhichOneof("attributes") for e in h.events]
    return out


def cluster_only(h: dict[str, list[str]]) -> dict[str, list[str]]:
    """The histories a read could grow: the cluster's workflows (a deployment's own ticks are not a read's)."""
    return {k: v for k, v in h.items() if k.startswith("cluster")}


IN_FLIGHT = ("workflow_task_scheduled_event_attributes", "workflow_task_started_event_attributes")


async def quiet(lv: Live, timeout: float = 60) -> dict[str, list[str]]:
    """The cluster's histories once none has a workflow task in flight: a task the server had
    scheduled before the reads completes on its own (its completion is no read's), on a loaded
    machine seconds after the workflow's start."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        got = cluster_only(await histories(lv))
        busy = [k for k, v in got.items() if v and v[-1] in IN_FLIGHT]
        if not busy:
            return got
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"a workflow task still in flight after {timeout} s: {busy}")
        await asyncio.sleep(0.2)


def test_a_read_adds_no_history_event(tmp_path):
    asyncio.run(_reads(tmp_path))


async def _reads(tmp_path) -> None:
    lv = await Live(str(tmp_path), t=T).start({})
    try:
        # a PENDING replica, as the control plane records one that no host can take (no workflow of its
        # own: the reads read the store alone)
        records.save_deployment(lv.engine, "big", spec("big", 200).model_dump(mode="json", exclude_none=True), 1)
        records.create_instances(lv.engine, [InstanceRecord(name="big-0", deployment="big", model="big",
                                                             state="pending", reason="0/0 hosts")])
        first = cli(lv, "queue", "--json")  # the reads workflow answers (started by the server at boot)
        assert first.returncode == 0, first.stderr
        before = await quiet(lv)
        reads = [("queue", "--json"), ("keys", "list"), ("keys", "usage"), ("tenants",), ("status",),
                 ("explain", "big", "--history")]
        for args in reads:
            r = cli(lv, *args)
            assert r.returncode == 0, (args, r.stdout, r.stderr)
        queue = json.loads(cli(lv, "queue", "--json").stdout)["queue"]
        assert [q["instance"] for q in queue] == ["big-0"] and queue[0]["reason"] != "-", queue
        after = await quiet(lv)
        assert after == before, {k: v[len(before.get(k, [])):] for k, v in after.items()}  # what the reads added
    finally:
        lv.close()
