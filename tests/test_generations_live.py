"""Instance workflow code generations (workflows/common.py: patched, CODE_1) on the real dev
server: a replica started by today's code records no patch markers and upserts no search
attributes before it is placed; one started as a release before generations started it (no
``code`` in its input, no search attributes) takes the patched paths and records them; both reach
RUNNING, both histories replay under the full sandbox."""

from __future__ import annotations

import asyncio

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from activities.payloads import CONTROL_QUEUE, InstanceInput
from gpuflow import ops
from gpuflow.server import WORKFLOWS
from tests.live import FAST, Live, spec
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


async def test_todays_replicas_skip_patch_markers_and_older_ones_still_run_and_replay(tmp_path):
    lv = await Live(str(tmp_path)).start({"h1": [24, 24]})
    try:
        await ops.deploy(lv.client, spec("new", 4), FAST)
        old = spec("old", 4).model_dump(mode="json", exclude_none=True)
        # as start_instances did before generations: no ``code``, no search attributes
        await lv.client.start_workflow("ModelInstanceWorkflow", InstanceInput(name="old-0", deployment="old", spec=old,
                                                                              timings=FAST),
                                       id="instance/old-0", task_queue=CONTROL_QUEUE)
        await lv.wait(lambda: lv.states("new") == {"new-0": "running"} and lv.states("old") == {"old-0": "running"},
                      60, "both replicas RUNNING")

        new_h = await lv.client.get_workflow_handle("instance/new-0").fetch_history()
        old_h = await lv.client.get_workflow_handle("instance/old-0").fetch_history()
        new_k, old_k = kinds(new_h), kinds(old_h)
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
        await ops.delete(lv.client, "new", wait=True)
        await lv.wait(lambda: lv.states("old") == {}, 30, "old-0 stopped")
        replayer = Replayer(workflows=WORKFLOWS, data_converter=pydantic_data_converter)  # the full sandbox
        for wid in ("instance/new-0", "instance/old-0"):
            await replayer.replay_workflow(await lv.client.get_workflow_handle(wid).fetch_history())
    finally:
        lv.close()
