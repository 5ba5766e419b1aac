"""Instance workflow code generations (workflows/common.py: patched, CODE_1, generation) on the
real dev server: a replica started by today's code records no patch markers and upserts no search
attributes before it is placed; one started as a release before generations started it (no
``code`` in its input, no search attributes) takes the patched paths and records them. Today's
supervisor heartbeats within supervise_heartbeat_s (generation 2: liveness per host); those of
generations 0 and 1 within host_heartbeat_s, as they always did. All reach RUNNING, all stop
their processes, all histories replay under the full sandbox."""

from __future__ import annotations

import asyncio

from temporalio.worker import Replayer

from contracts.control import CONTROL_QUEUE, InstanceInput
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


def supervisor_heartbeats(history) -> list[float]:
    """The heartbeat timeout (s) of each supervisor the run started."""
    return [a.heartbeat_timeout.ToTimedelta().total_seconds() for e in history.events
            if e.HasField("activity_task_scheduled_event_attributes")
            for a in [e.activity_task_scheduled_event_attributes] if a.activity_type.name == hp.SUPERVISE_INSTANCE]


async def test_todays_replicas_skip_patch_markers_and_older_ones_still_run_and_replay(tmp_path):
    lv = await Live(str(tmp_path)).start({"h1": [24, 24]})
    try:
        await ops.deploy(lv.client, spec("new", 4), FAST)
        old = spec("old", 4).model_dump(mode="json", exclude_none=True)
        # as start_instances did before generations: no ``code``, no search attributes
        await lv.client.start_workflow("ModelInstanceWorkflow", InstanceInput(name="old-0", deployment="old", spec=old,
                                                                              timings=FAST),
                                       id="instance/old-0", task_queue=CONTROL_QUEUE)
        mid = spec("mid", 4).model_dump(mode="json", exclude_none=True)  # generation 1: per-replica liveness
        await lv.client.start_workflow("ModelInstanceWorkflow", InstanceInput(name="mid-0", deployment="mid", spec=mid,
                                                                              timings=FAST, code=1),
                                       id="instance/mid-0", task_queue=CONTROL_QUEUE)
        await lv.wait(lambda: lv.states("new") == {"new-0": "running"} and lv.states("old") == {"old-0": "running"}
                      and lv.states("mid") == {"mid-0": "running"}, 60, "the three replicas RUNNING")
        pids = {n: lv.instances(n)[0].pid for n in ("new", "old", "mid")}

        new_h = await lv.client.get_workflow_handle("instance/new-0").fetch_history()
        old_h = await lv.client.get_workflow_handle("instance/old-0").fetch_history()
        new_k, old_k = kinds(new_h), kinds(old_h)
        mid_h = await lv.client.get_workflow_handle("instance/mid-0").fetch_history()
        assert supervisor_heartbeats(new_h) == [FAST.supervise_heartbeat_s]  # 300 s: the host's watch speaks for it
        # local activities on the way to RUNNING: today's place (booked STARTING) and RUNNING; generation 1
        # recorded STARTING on its own between them
        assert [kinds(h).count("marker_recorded:core_local_activity") for h in (new_h, mid_h)] == [2, 3]
        assert supervisor_heartbeats(mid_h) == supervisor_heartbeats(old_h) == [FAST.host_heartbeat_s]
        # today's: placed by a local activity in its first task, no patch marker, no upsert before placing
        assert not [k for k in new_k if k == "marker_recorded:core_patch"], new_k
        assert new_k[:6] == ["workflow_execution_started", "workflow_task_scheduled", "workflow_task_started",
                             "workflow_task_completed", "marker_recorded:core_local_activity",
                             "upsert_workflow_search_attributes:GpuflowState,GpuflowWorker"], new_k
        # the older one: its model and deployment upserted first, then a marker (and a TemporalChangeVersion
        # upsert) for each patch it met on the way: the same steps, asked for one by one
        assert old_k[4] == "upsert_workflow_search_attributes:GpuflowDeployment,GpuflowModel", old_k
        assert old_k.count("marker_recorded:core_patch") >= 3, old_k  # place-in-one, place-local, record-local

        # the Temporal UI's filters find both by model and deployment
        for name in ("new", "old"):
            q = (f"{SA_MODEL.name} = '{name}' AND {SA_DEPLOYMENT.name} = '{name}'"
                 " AND WorkflowType = 'ModelInstanceWorkflow'")
            for _ in range(30):
                found = [w.id async for w in lv.client.list_workflows(q)]
                if found:
                    break
                await asyncio.sleep(0.3)
            assert found == [f"instance/{name}-0"]

        await lv.client.get_workflow_handle("instance/old-0").signal("stop")
        await lv.client.get_workflow_handle("instance/mid-0").signal("stop")
        await ops.delete(lv.client, "new", wait=True)
        await lv.wait(lambda: lv.states("old") == {} and lv.states("mid") == {}, 30, "old-0 and mid-0 stopped")
        table = lv.stack.instance_processes("h1")
        # generation 2 stops its process with stop_instance (its supervisor's cancel does not); the
        # older ones by cancelling their supervisors
        await lv.wait(lambda: all(table.returncode(pid) is not None for pid in pids.values()), 10, "processes gone")
        replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER)  # the full sandbox
        for wid in ("instance/new-0", "instance/old-0", "instance/mid-0"):
            await replayer.replay_workflow(await lv.client.get_workflow_handle(wid).fetch_history())
    finally:
        lv.close()
