"""One booking, one set of processes (issue 40: H2, M2, M3 and the lows), on the dev stack: the
Temporal dev server, a control-plane worker and an agent process with simulated GPUs. Each case is
the outside probe's, sent the way anyone who can reach Temporal can send it:

- a booked instance's name with a new part (``p9``) starts nothing, and a relaunch of its server
  starts no second one;
- the orphan check stops a process no booking names (its pid file written as an earlier run's
  launch would have), and leaves the booked replica alone; it reads the ledger by the reads
  workflow's query (no event in the host's history), and by the host workflow's update when
  somebody's own workflow squats the reads workflow's id (its answer is never asked for);
- an instance workflow started by hand (M2), and a workflow of one's own that continues as new into
  one with a placement (M3), end naming why and hold nothing in the ledger;
- ``stop`` with garbage arguments stops nothing; the ``booking`` update refuses a field it does
  not know."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from datetime import timedelta

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError
from temporalio.service import RPCError
from temporalio.worker import Worker

from contracts import agent as hp
from contracts.control import CONTROL_QUEUE, InstanceInput, PlacementPlan
from contracts.control_run import Squatted
from contracts.host import BOOKING_UPDATE, BOOKINGS_UPDATE
from contracts.ids import (CLUSTER_BOOKINGS, CLUSTER_ID, CLUSTER_READS_ID, CLUSTER_SETTINGS, INSTANCE_STOP, deployment_id,
                          host_id)
from contracts.records import StartInstances
from gpuflow import cluster_client, ops
from scheduler.cluster import Claim
from store import ledger
from tests.live import FAST, Live, spec
from tests.test_trust_live import GhostLaunch, marking
from worker_agent.processes import pid_alive

pytestmark = pytest.mark.asyncio
T = FAST.model_copy(update={"orphan_check_s": 1.0})  # the agent's orphan check every second


@workflow.defn(name="Bypass", sandboxed=False)
class Bypass:
    """Somebody's own workflow, with an instance's workflow id, that continues as new into
    ModelInstanceWorkflow carrying a placement: its new run's ``continued_run_id`` is set (M3)."""

    @workflow.run
    async def run(self, inp: InstanceInput) -> None:
        workflow.continue_as_new(inp, workflow="ModelInstanceWorkflow", task_queue=CONTROL_QUEUE)


@workflow.defn(name="StartOthers", sandboxed=False)
class StartOthers:
    """Somebody's own workflow scheduling the control plane's start_instances, which makes the
    replicas it starts wanted (the ledger books those): the deployment's own call, made by another."""

    @workflow.run
    async def run(self, batch: StartInstances) -> str:
        try:
            await workflow.execute_activity("start_instances", batch, task_queue=CONTROL_QUEUE,
                                            start_to_close_timeout=timedelta(seconds=30))
        except ActivityError as e:
            return f"{getattr(e.cause, 'type', '')}: {getattr(e.cause, 'message', e.cause)}"
        return "started"


@workflow.defn(name="Squatter", sandboxed=False)
class Squatter:
    """Somebody's own workflow with the reads workflow's id, or a host workflow's, on their own
    queue, whose ``bookings`` query and ``booking`` and ``bookings`` updates say every instance
    asked about is booked on the host (on GPUs 0 and 1), and whose ``settings`` read answers too."""

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.query(name=CLUSTER_BOOKINGS)
    def bookings(self, ask: dict) -> dict:
        return {"bookings": {n: BOOKED for n in ask["instances"]}}

    @workflow.query(name=CLUSTER_SETTINGS)
    def settings(self, ask: dict) -> dict:
        return {}

    @workflow.update(name=BOOKING_UPDATE)
    async def booking(self, ask: dict) -> dict:
        return BOOKED

    @workflow.update(name=BOOKINGS_UPDATE)
    async def bookings_update(self, ask: dict) -> dict:
        return {"bookings": {n: BOOKED for n in ask["instances"]}}


BOOKED = {"booked": True, "gpu_indexes": [0, 1], "parts": [{"part": "", "role": "server", "gpu_indexes": [0, 1]}]}


@workflow.defn(name="OneTryLaunch", sandboxed=False)
class OneTryLaunch:
    """GhostLaunch (tests/test_trust_live.py) tried once: what the agent answers the first time."""

    @workflow.run
    async def run(self, args: list) -> str:
        host, req = args
        try:
            await workflow.execute_activity(hp.LAUNCH_INSTANCE, req, task_queue=f"gpuflow-host-{host}",
                                            start_to_close_timeout=timedelta(seconds=30),
                                            retry_policy=RetryPolicy(maximum_attempts=1))
        except ActivityError as e:
            return f"{getattr(e.cause, 'type', '')}: {getattr(e.cause, 'message', e.cause)}"
        return "launched"


async def legit(lv: Live, marks: str) -> None:
    await ops.deploy(lv.client, spec("legit", vram_gib=20, command=marking(marks, "legit")), T)
    await lv.wait(lambda: lv.states("legit") == {"legit-0": "running"}, 60, "legit RUNNING")


async def ghost(lv: Live, req: hp.LaunchRequest) -> str:
    queue = f"ghost-{uuid.uuid4().hex[:8]}"
    async with Worker(lv.client, task_queue=queue, workflows=[GhostLaunch]):
        return await lv.client.execute_workflow("GhostLaunch", ["h1", req], id=f"ghost/{queue}", task_queue=queue)


async def test_a_booked_name_with_a_new_part_starts_nothing(tmp_path):
    marks = str(tmp_path / "marks")
    os.mkdir(marks)
    lv = await Live(str(tmp_path), t=T).start({"h1": [24, 24]})
    try:
        await legit(lv, marks)
        pid = lv.instances("legit")[0].pid
        p9 = hp.LaunchRequest(instance="legit-0", part="p9", model="legit", backend="custom", gpu_indexes=[0],
                              run_command=marking(marks, "p9"), ready_timeout_s=10, settle_s=0.5)
        said = await ghost(lv, p9)
        assert said.startswith("NotBooked: instance legit-0 has no part 'p9' booked on host h1 (booked here: '')"), said
        # its server's part again, with no claim and another command: adopted, no second process
        again = p9.model_copy(update={"part": "", "run_command": marking(marks, "again"),
                                      "gpu_indexes": lv.instances("legit")[0].gpu_indexes})
        assert await ghost(lv, again) == "launched"
        assert sorted(os.listdir(marks)) == ["legit"]  # neither p9 nor a second server ever started
        assert lv.instances("legit")[0].pid == pid and pid_alive(pid)
        assert sorted(r.instance for r in lv.stack.instance_processes("h1").records()) == ["legit-0"]
    finally:
        lv.close()


async def bookings_asked(lv: Live) -> int:
    """How many ``bookings`` updates h1's host workflow has taken (its history's accepted ones)."""
    h = await lv.client.get_workflow_handle(host_id("h1")).fetch_history()
    return sum(1 for e in h.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
               and e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name == BOOKINGS_UPDATE)


def planted(lv: Live, key: str) -> int:
    """A real process in the agent's process table that no launch of this agent started."""
    return lv.stack.instance_processes("h1").start(key, [sys.executable, "-c", "import time; time.sleep(120)"],
                                                   {}, None).pid


async def test_the_orphan_check_stops_a_process_started_outside_any_booking(tmp_path):
    marks = str(tmp_path / "marks")
    os.mkdir(marks)
    lv = await Live(str(tmp_path), t=T).start({"h1": [24, 24]})
    strays: dict[str, int] = {}
    try:
        await legit(lv, marks)
        pid = lv.instances("legit")[0].pid
        # a booked instance's name with a part no booking names (the probe's p9, left by a launch
        # before this check), and an instance nobody booked
        strays = {k: planted(lv, k) for k in ("legit-0@p9", "nobody-0")}
        await lv.wait(lambda: not any(pid_alive(p) for p in strays.values()), 30, "both strays stopped")
        log = open(os.path.join(lv.stack.log_dir, "agent-h1.log")).read()
        assert "stopped orphan legit-0@p9" in log and "no booking in the ledger names part 'p9'" in log, log[-2000:]
        await asyncio.sleep(3 * T.orphan_check_s)  # three more checks: the booked replica is left alone
        assert pid_alive(pid) and lv.states("legit") == {"legit-0": "running"}
        # every check so far read the ledger by the reads workflow's query: nothing in the host's history
        assert await bookings_asked(lv) == 0
        # somebody's own workflow squats the reads workflow's id and says every instance is booked: the
        # agent asks it nothing, the host workflow's update answers instead, and the check goes on
        await lv.client.get_workflow_handle(CLUSTER_READS_ID).terminate("the test: a squatter takes its id")
        queue = f"squat-{uuid.uuid4().hex[:8]}"
        async with Worker(lv.client, task_queue=queue, workflows=[Squatter]):
            await lv.client.start_workflow("Squatter", id=CLUSTER_READS_ID, task_queue=queue)
            strays["nobody-1"] = planted(lv, "nobody-1")
            await lv.wait(lambda: not pid_alive(strays["nobody-1"]), 30, "the third stray stopped")
        assert await bookings_asked(lv) >= 1 and pid_alive(pid)
        log = open(os.path.join(lv.stack.log_dir, "agent-h1.log")).read()
        assert "cluster-reads is a Squatter on " in log and "not the control plane's ClusterReadsWorkflow" in log, \
            log[-2000:]
    finally:
        for p in strays.values():
            subprocess.run(["kill", "-9", str(p)], capture_output=True)
        lv.close()


async def test_a_squatter_on_the_control_planes_ids_is_asked_nothing(tmp_path):
    """Somebody's own workflow takes the ids host/h1, cluster-reads and cluster (each terminated
    first), saying every instance is booked: a launch that carries no booking proof starts nothing
    (BookingUnknown naming the squatter; before contracts/control_run.py it launched), the orphan
    check still stops a stray (its instance workflows asked instead), and the CLI's reads and
    changes (a key, a cordon; a deploy and a scale of a deployment whose id it holds) are refused
    naming the squatter."""
    marks = str(tmp_path / "marks")
    os.mkdir(marks)
    lv = await Live(str(tmp_path), t=T).start({"h1": [24, 24]})
    stray = 0
    try:
        queue = f"squat-{uuid.uuid4().hex[:8]}"
        async with Worker(lv.client, task_queue=queue, workflows=[Squatter, OneTryLaunch]):
            for wid in (host_id("h1"), CLUSTER_READS_ID, CLUSTER_ID):
                await lv.client.get_workflow_handle(wid).terminate("the test: a squatter takes its id")
                await lv.client.start_workflow("Squatter", id=wid, task_queue=queue)
            req = hp.LaunchRequest(instance="nobody-0", model="nobody", backend="custom", gpu_indexes=[0],
                                   run_command=marking(marks, "nobody"), ready_timeout_s=10, settle_s=0.5)
            said = await lv.client.execute_workflow("OneTryLaunch", ["h1", req], id=f"ghost/{queue}", task_queue=queue)
            assert said.startswith("BookingUnknown: cannot ask the control plane for the booking of nobody-0 on h1: "
                                   f"host/h1 is a Squatter on '{queue}', not the control plane's HostWorkflow"), said
            stray = planted(lv, "nobody-1")
            await lv.wait(lambda: not pid_alive(stray), 30, "the stray stopped")
            with pytest.raises(Squatted, match="cluster-reads is a Squatter on .* ClusterReadsWorkflow"):
                await cluster_client.settings(lv.client)
            with pytest.raises(Squatted, match="cluster is a Squatter on .* ClusterWorkflow"):
                await cluster_client.create_key(lv.client, "default")
            with pytest.raises(Squatted, match="host/h1 is a Squatter on .* HostWorkflow"):
                await ops.cordon(lv.client, "h1", True)
            # a deployment's id held before it is deployed: neither deploy nor scale talks to it
            await lv.client.start_workflow("Squatter", id=deployment_id("held"), task_queue=queue)
            for call in (ops.deploy(lv.client, spec("held", vram_gib=20), T), ops.scale(lv.client, "held", 2)):
                with pytest.raises(Squatted, match="deployment/held is a Squatter on .* ModelDeploymentWorkflow"):
                    await call
        assert os.listdir(marks) == []  # nobody-0's command never ran
        log = open(os.path.join(lv.stack.log_dir, "agent-h1.log")).read()
        assert "not asked: host/h1 is a Squatter on " in log, log[-2000:]
    finally:
        if stray:
            subprocess.run(["kill", "-9", str(stray)], capture_output=True)
        lv.close()


async def test_instance_workflows_started_by_hand_or_continued_into_hold_nothing(tmp_path):
    """M2: started by hand without a placement (the ledger would have booked it like a replica that
    ``status`` never lists); M3: somebody's workflow continued as new into one, carrying a
    placement past the new-instance guard (it trusted ``continued_run_id``). Both end, failed,
    naming why; neither holds a ledger line nor starts a process, though a GPU is free. Nor does
    calling the deployment's own start_instances from a workflow of one's own make a replica."""
    marks = str(tmp_path / "marks")
    os.mkdir(marks)
    lv = await Live(str(tmp_path), t=T).start({"h1": [24, 24]})
    try:
        await legit(lv, marks)
        raw = spec("legit", vram_gib=20, command=marking(marks, "hand")).model_dump(mode="json", exclude_none=True)
        by_hand = await lv.client.start_workflow("ModelInstanceWorkflow", InstanceInput(
            name="legit-7", deployment="legit", spec=raw, timings=T), id="instance/legit-7", task_queue=CONTROL_QUEUE)
        plan = PlacementPlan(worker="h1", gpu_indexes=[1], claim=Claim(ram=2**30, vram={1: 20 * 2**30}))
        queue = f"bypass-{uuid.uuid4().hex[:8]}"
        async with Worker(lv.client, task_queue=queue, workflows=[Bypass, StartOthers]):
            await lv.client.start_workflow("Bypass", InstanceInput(name="legit-8", deployment="legit", spec=raw,
                                                                   timings=T, placement=plan),
                                           id="instance/legit-8", task_queue=queue)
            bypass = lv.client.get_workflow_handle("instance/legit-8")
            for handle, name in ((by_hand, "legit-7"), (bypass, "legit-8")):
                with pytest.raises(WorkflowFailureError) as e:
                    await asyncio.wait_for(handle.result(), 60)
                assert e.value.cause.type == "NotWanted", e.value.cause
                assert f"instance {name} was not started by" in str(e.value.cause), e.value.cause
                assert ledger.workers_of(lv.engine, name) == []
            start = StartInstances(instances=[InstanceInput(name="legit-9", deployment="legit", spec=raw, timings=T)])
            await lv.client.start_workflow("StartOthers", start, id=f"start/{queue}", task_queue=queue)
            said = await lv.client.get_workflow_handle(f"start/{queue}").result()
        assert said.startswith("InvalidInput: start_instances acts only for the workflow its input names "
                               "(ModelDeploymentWorkflow 'deployment/legit'); called by StartOthers"), said
        assert "legit-9" not in lv.states() and ledger.workers_of(lv.engine, "legit-9") == []
        with pytest.raises(RPCError):  # no workflow was started for it either
            await lv.client.get_workflow_handle("instance/legit-9").describe()
        assert ledger.booked_per_gpu(lv.engine) == {("h1", lv.instances("legit")[0].gpu_indexes[0]): 20 * 2**30}
        assert sorted(os.listdir(marks)) == ["legit"]
    finally:
        lv.close()


async def handled(lv: Live, wid: str, after: int) -> bool:
    """Whether a workflow task completed after event ``after`` (the signal was handled)."""
    events = [e async for e in lv.client.get_workflow_handle(wid).fetch_history_events()]
    return any(e.event_id > after and e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED for e in events)


async def test_garbage_stop_and_a_booking_with_extra_fields_are_refused(tmp_path):
    marks = str(tmp_path / "marks")
    os.mkdir(marks)
    lv = await Live(str(tmp_path), t=T).start({"h1": [24]})
    try:
        await legit(lv, marks)
        h = lv.client.get_workflow_handle("instance/legit-0")
        await h.signal(INSTANCE_STOP, "garbage")
        events = [e async for e in h.fetch_history_events()]
        sent = max(e.event_id for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)
        await lv.wait_async(lambda: handled(lv, "instance/legit-0", sent), 30, "the stop signal handled")
        await asyncio.sleep(2)  # a teardown would have begun by now
        assert (await h.describe()).status.name == "RUNNING" and lv.states("legit") == {"legit-0": "running"}
        with pytest.raises(WorkflowUpdateFailedError) as e:
            await lv.client.get_workflow_handle("host/h1").execute_update(
                BOOKING_UPDATE, {"instance": "legit-0", "part": "p9"})
        assert "part" in str(e.value.cause) and "Extra inputs are not permitted" in str(e.value.cause), e.value.cause
    finally:
        lv.close()
