"""An instance workflow on the real dev server, in the history it writes: no patch markers (the
project keeps no version branches before its first release), no search attributes upserted before
it is placed (start_instances sets them), placed by a local activity in its first workflow task,
two local activities on the way to RUNNING, and no activity once RUNNING: its host's agent
supervises the process and its watch speaks for it (worker_agent/supervision.py). It stops its
process, and its history replays under the full sandbox."""

from __future__ import annotations

import asyncio

from temporalio.worker import Replayer

from gpuflow import ops
from gpuflow.converter import DATA_CONVERTER
from gpuflow.server import WORKFLOWS
from tests.live import FAST, Live, spec
from contracts import agent as hp
from workflows.common import SA_DEPLOYMENT, SA_MODEL


def kinds(history) -> list[str]:
    out = []
    for e in history.events:
        k = e.WhichOneof("attributes").replace("_event_attributes", "")
        if k == "marker_recorded":
            k += ":" + e.marker_recorded_event_attributes.marker_name
        if k == "upsert_workflow_search_attributes":
            k += ":" + ",".join(sorted(e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields))
        out.append(k)
    return out


def activities(history) -> list[str]:
    """The activity types the run scheduled, in order."""
    return [e.activity_task_scheduled_event_attributes.activity_type.name for e in history.events
            if e.HasField("activity_task_scheduled_event_attributes")]


async def test_a_replica_records_no_patch_marker_and_replays(tmp_path):
    lv = await Live(str(tmp_path)).start({"h1": [24, 24]})
    try:
        await ops.deploy(lv.client, spec("new", 4), FAST)
        await lv.wait(lambda: lv.states("new") == {"new-0": "running"}, 60, "the replica RUNNING")
        pid = lv.instances("new")[0].pid

        # RUNNING is recorded by a local activity; the run then waits with nothing scheduled (read the
        # history once that task has written it, not at the first look: a loaded CI machine lags)
        for _ in range(120):
            h = await lv.client.get_workflow_handle("instance/new-0").fetch_history()
            k = kinds(h)
            if k.count("marker_recorded:core_local_activity") == 2 and k[-1] == "workflow_task_completed":
                break
            await asyncio.sleep(0.25)
        assert activities(h) == [hp.LAUNCH_INSTANCE]  # no supervisor: the agent supervises, its watch tells
        # local activities on the way to RUNNING: the place (booked STARTING) and RUNNING
        assert k.count("marker_recorded:core_local_activity") == 2, k
        # placed by a local activity in its first task, no patch marker, no upsert before placing
        assert not [x for x in k if x == "marker_recorded:core_patch"], k
        assert k[:6] == ["workflow_execution_started", "workflow_task_scheduled", "workflow_task_started",
                         "workflow_task_completed", "marker_recorded:core_local_activity",
                         "upsert_workflow_search_attributes:GpuflowState,GpuflowWorker"], k

        # the Temporal UI's filters find it by model and deployment
        q = f"{SA_MODEL.name} = 'new' AND {SA_DEPLOYMENT.name} = 'new' AND WorkflowType = 'ModelInstanceWorkflow'"
        for _ in range(30):
            found = [w.id async for w in lv.client.list_workflows(q)]
            if found:
                break
            await asyncio.sleep(0.3)
        assert found == ["instance/new-0"]

        await ops.delete(lv.client, "new", wait=True)
        table = lv.stack.instance_processes("h1")
        # stopped with stop_instance on its host
        await lv.wait(lambda: table.returncode(pid) is not None, 10, "process gone")
        replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER)  # the full sandbox
        await replayer.replay_workflow(await lv.client.get_workflow_handle("instance/new-0").fetch_history())
    finally:
        lv.close()
