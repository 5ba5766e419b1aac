"""The record-keeping activities (task queue ``gpuflow-control``): a deployment's row, the instance
rows (group-committed: activities/record_batch.py), the first rows and workflows of new replicas,
and the clean-up of instances whose workflows ended without their own teardown. Each takes one
input (contracts/records.py, contracts/control.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from sqlalchemy.engine import Engine
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from contracts.ids import instance_id
from activities import callers
from activities.record_batch import RecordBatch
from activities.runner import Runner
from contracts import activity_names as c, ui_text
from contracts.control import CONTROL_QUEUE, ClosedInstance, ClosedInstances, InstanceNames, InstanceRecord
from contracts.records import SaveDeployment, StartInstances
from contracts.search import SA_DEPLOYMENT, SA_MODEL, SA_STATE
from scheduler.naming import name_problem
from store import ledger, records
from store.engine_keys import UnprovenLaunch

log = logging.getLogger("gpuflow.records")
LIST_CHUNK = 100  # workflow ids in one visibility query (closed_workflows)


async def listed_running(client: Client, names: list[str]) -> set[str]:
    """Which of ``names`` the visibility store lists as running instance workflows: one list
    call per LIST_CHUNK names, where a describe each made every deployment's reconcile cost
    one RPC per replica (1,500 every reconcile_s at 1,500 replicas). Visibility may lag: a name
    not listed is only a candidate, which the caller describes; one that ended a moment ago and
    is still listed is found by the next reconcile. Only names that pass the name
    rule go into the query (letters, digits, '.', '_', '-': nothing to escape in quotes)."""
    ok = sorted({n for n in names if not name_problem(n)})
    found: set[str] = set()
    for i in range(0, len(ok), LIST_CHUNK):
        ids = ", ".join(f"'instance/{n}'" for n in ok[i:i + LIST_CHUNK])
        q = f"WorkflowType = 'ModelInstanceWorkflow' AND ExecutionStatus = 'Running' AND WorkflowId IN ({ids})"
        try:
            async for w in client.list_workflows(q):
                found.add(w.id.removeprefix("instance/"))
        except RPCError:  # visibility unavailable: every name is described, as before
            return set()
        if activity.in_activity():
            activity.heartbeat()
    return found


class RecordActivities:
    def __init__(self, engine: Engine, client: Client, runner: Runner, rows: RecordBatch,
                 wake: Callable[[], Awaitable[int]]):
        """``rows``: the instance rows' group commit; ``wake``: the PENDING queue's wake
        (wake_queue.Waker), after a closed instance's reservation is released."""
        self.engine, self.client, self.runner, self.rows, self.wake = engine, client, runner, rows, wake

    def all(self) -> list:
        return [self.save_deployment, self.record_instance, self.start_instances, self.closed_workflows]

    @activity.defn(name=c.SAVE_DEPLOYMENT)
    async def save_deployment(self, row: SaveDeployment) -> None:
        callers.check(c.SAVE_DEPLOYMENT, row)
        await self.runner.run(records.save_deployment, self.engine, row.name, row.spec, row.replicas, row.state)

    @activity.defn(name=c.RECORD_INSTANCE)
    async def record_instance(self, rec: InstanceRecord) -> None:
        """The instance's row (group-committed). A RUNNING record at a port its host did not vouch
        for, or on a host the ledger does not book it on, is refused (LaunchUnproven, non-retryable:
        store/engine_keys.py check_launches) and nothing of it is written."""
        callers.check(c.RECORD_INSTANCE, rec)
        try:
            await self.runner.heartbeating(self.rows.record(rec))
        except UnprovenLaunch as e:
            log.warning("%s", e)
            raise ApplicationError(str(e), type="LaunchUnproven", non_retryable=True) from None

    @activity.defn(name=c.START_INSTANCES)
    async def start_instances(self, batch: StartInstances) -> None:
        """The first rows of a batch of replicas in one transaction, then their workflows started
        together, with their search attributes set (the workflow then upserts none of its own until it is placed). A retry is harmless:
        rows already written are kept, and a workflow already running is used as it is
        (USE_EXISTING)."""
        callers.check(c.START_INSTANCES, batch)
        inputs = batch.instances
        await self.runner.run(records.create_instances, self.engine, [InstanceRecord(
            name=inp.name, deployment=inp.deployment, model=str(inp.spec.get("name", "")), state="pending")
            for inp in inputs])
        activity.heartbeat()
        await asyncio.gather(*(self.client.start_workflow(
            "ModelInstanceWorkflow", inp, id=instance_id(inp.name),
            task_queue=CONTROL_QUEUE, id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            search_attributes=TypedSearchAttributes([
                SearchAttributePair(SA_MODEL, str(inp.spec.get("name", ""))),
                SearchAttributePair(SA_DEPLOYMENT, inp.deployment), SearchAttributePair(SA_STATE, "PENDING")]),
            static_summary=f"replica {inp.name} of {inp.deployment}",
            static_details=ui_text.instance_details(inp.spec, inp.deployment)) for inp in inputs))

    @activity.defn(name=c.CLOSED_WORKFLOWS)
    async def closed_workflows(self, asked: InstanceNames) -> ClosedInstances:
        """Which of these instances' workflows are not running. One that ended without its own
        teardown (terminated from the UI, say) has its reservation released here and is
        recorded deleted; the caller stops its process on the host. Only the deployment's own
        replicas (``<deployment>-<n>``), for the deployment's workflow."""
        callers.check(c.CLOSED_WORKFLOWS, asked)
        names, closed, released = asked.names, [], 0
        running = await listed_running(self.client, names)
        for n in names:
            if n in running:
                continue
            activity.heartbeat()
            try:
                d = await self.client.get_workflow_handle(instance_id(n)).describe()
                status = d.status.name if d.status is not None else "UNKNOWN"
            except RPCError as e:
                if e.status != RPCStatusCode.NOT_FOUND:
                    raise  # Temporal did not answer: retried, never read as an ended workflow
                status = "NOT_FOUND"
            if status == "RUNNING":
                continue
            held = await self.runner.run(ledger.workers_of, self.engine, n)
            worker = await self.runner.run(records.mark_gone, self.engine, n, f"its workflow ended: {status}")
            released += await self.runner.run(ledger.release, self.engine, n)
            hosts = ([worker] if worker else []) + [w for w in held if w != worker]
            closed.append(ClosedInstance(name=n, status=status, worker=worker, hosts=hosts))
        if released or (closed and activity.info().attempt > 1):
            await self.wake()
        return ClosedInstances(closed=closed)
