"""ModelInstanceWorkflow (id ``instance/<name>``): one replica's whole life.

PENDING -> ANALYZING (estimate) -> decide and book (place_steps.py) -> SCHEDULED -> launch on the
host's queue (host_steps.py) -> STARTING -> RUNNING -> supervise (supervise_steps.py). A process
exit gives ERROR and a restart on the same host after min(base * 2^(n-1), cap) seconds. A host
that stops answering gives UNREACHABLE; if it is back within the grace period the process is
adopted (or restarted) there, otherwise the reservation is released and the instance is placed
elsewhere. An unschedulable instance waits PENDING with its reasons until a ``capacity_changed``
signal (a release, a host joining or changing, the queue's sweep). ``stop`` stops the process,
releases the reservation and ends the workflow.

What happens next is decided by a pure function, ``step(state, event)`` (instance_machine.py);
this class holds the state (one ``InstanceState``), answers the signals, query and search
attributes, and does each action the function names (its I/O lives in the classes it inherits,
one per concern).

Preemption (scheduler/tenancy/preemption.py): a decision may place the replica by taking the GPUs
of victims. The ledger moves them in one transaction; the preemptor then signals each victim
``preempt`` and waits for ``victim_stopped`` from each (or the store showing it stopped) before it
launches on those GPUs. A victim drains, stops its processes, and waits PENDING in its own
deployment with the reason ``preempted by prod/chat-0 to reclaim prod's guarantee``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from contracts.ids import DEPLOYMENT_INSTANCE_ENDED, INSTANCE_CAPACITY_CHANGED, INSTANCE_HOST_NEWS, INSTANCE_PREEMPT, INSTANCE_STATUS, INSTANCE_STOP, INSTANCE_VICTIM_STOPPED, deployment_id, instance_id
    from contracts.control import HostNews, InstanceInput, InstanceView, PreemptNotice
    from contracts.host import HeldAsk
    from scheduler.naming import name_problem
    from scheduler.spec import ModelSpec
    from workflows import common as c
    from workflows import guards
    from workflows import instance_machine as m
    from workflows import signals
    from workflows.host_steps import HostSteps
    from workflows.inputs import one_input
    from workflows.instance_machine import InstanceState
    from workflows.place_steps import PlaceSteps



@workflow.defn(name="ModelInstanceWorkflow")
class ModelInstanceWorkflow(PlaceSteps, HostSteps):
    @workflow.init
    def __init__(self, *args: Any) -> None:
        inp = one_input(args, InstanceInput, "ModelInstanceWorkflow")
        self.inp, self.t = inp, inp.timings
        # The state, whole. ``step`` replaces it between actions; within an action it is one
        # object, which the signals below write to.
        self.s = InstanceState(plan=inp.placement, restarts=inp.restarts, decision=inp.decision)
        self.unwanted = ""  # why the ledger refused to place it (NotWanted): it ends, failed, naming that

    # --- messages -------------------------------------------------------------------------------
    @workflow.signal(name=INSTANCE_STOP)
    def stop(self, *args: Any) -> None:
        """Stop for good. It takes nothing: a stop that carries anything was not sent by gpuflow
        (``gpuflow delete``, a scale-down) and is refused, logged naming what it carried; nothing stops."""
        if signals.none(INSTANCE_STOP, args):  # garbage arguments stop nothing (refused: logged, counted)
            self.s.stop_requested = True

    # Every signal below is untrusted (anyone who can reach Temporal may send it): one that does not
    # validate changes nothing, and is logged and counted (workflows/signals.py).
    @workflow.signal(name=INSTANCE_CAPACITY_CHANGED)
    def capacity_changed(self, *args: Any) -> None:
        if signals.none(INSTANCE_CAPACITY_CHANGED, args):
            self.s.woken = True

    @workflow.signal(name=INSTANCE_PREEMPT)
    def preempt(self, *args: Any) -> None:
        """From a preemptor whose booking took this replica's GPUs (its names are checked)."""
        notice = signals.one(args, PreemptNotice, INSTANCE_PREEMPT)
        if notice is not None and signals.check(INSTANCE_PREEMPT, not name_problem(notice.instance),
                                                f"its preemptor {notice.instance!r} is not an instance name"):
            self.s.preempted = notice

    @workflow.signal(name=INSTANCE_VICTIM_STOPPED)
    def victim_stopped(self, *args: Any) -> None:
        name = signals.name(INSTANCE_VICTIM_STOPPED, args)
        if name is not None and signals.check(INSTANCE_VICTIM_STOPPED, len(self.s.victims_stopped) < 1000,
                                              "it already heard from 1000 victims"):
            self.s.victims_stopped.add(name)

    @workflow.signal(name=INSTANCE_HOST_NEWS)
    def host_news(self, *args: Any) -> None:
        """From the control plane (checked): a host of the placement was lost, or its agent
        restarted. Acted on while it supervises."""
        news = signals.one(args, HostNews, INSTANCE_HOST_NEWS)
        if news is not None and signals.check(INSTANCE_HOST_NEWS, news.host in self.s.news or len(self.s.news) < 64,
                                              "it already holds news of 64 hosts"):
            self.s.news[news.host] = news

    @workflow.query(name=INSTANCE_STATUS)
    def status(self) -> InstanceView:
        s = self.s
        return InstanceView(name=self.inp.name, deployment=self.inp.deployment, model=self.spec_name,
                            state=s.state, reason=s.reason, worker=self.worker, gpu_indexes=self.gpus,
                            restarts=s.restarts, pid=s.pid, port=s.port, address=s.address, decision=s.decision,
                            subordinate_workers=self.subordinate_workers, parts=dict(s.parts))

    # --- the life -------------------------------------------------------------------------------
    @workflow.run
    async def run(self, *args: Any) -> InstanceView:
        inp = self.inp
        try:
            spec = ModelSpec.model_validate(inp.spec)
        except ValidationError as e:
            raise ApplicationError(f"invalid model spec: {e}", type="InvalidSpec", non_retryable=True) from None
        self._check_names(spec)
        if self.s.plan is not None:
            await self._check_carried()
        self.s.source_key = spec.source.key
        sa = workflow.info().typed_search_attributes  # as the run started (its first event): deterministic
        if sa.get(c.SA_MODEL) != spec.name or sa.get(c.SA_DEPLOYMENT) != inp.deployment:
            # start_instances sets them; a run started otherwise (the Temporal CLI) sets its own
            workflow.upsert_search_attributes([c.SA_MODEL.value_set(spec.name),
                                               c.SA_DEPLOYMENT.value_set(inp.deployment)])
        try:
            await self._live(spec)
        except asyncio.CancelledError:
            self.s.stop_requested = True
            await self._teardown()
            raise
        await self._teardown()
        if self.unwanted:
            raise ApplicationError(self.unwanted, type="NotWanted", non_retryable=True)
        return self.status()

    async def _check_carried(self) -> None:
        """A placement in the input is this workflow's own, carried across continue-as-new (the guard
        in ``_check_names``). ``continued_run_id`` says only that some run continued as new into
        this one, and a workflow of anybody's can: so the placement is kept only when the ledger
        holds exactly it for this instance, a replica its deployment wants. Otherwise whatever it
        names is stopped, the ledger's lines (if any) released, and the replica placed again (which
        the ledger refuses to a replica nobody wants)."""
        why = await workflow.execute_local_activity(
            c.HELD_PLAN, HeldAsk(instance=self.inp.name, plan=self.s.plan), result_type=str, **c.STORE_LOCAL)
        if why:
            await self._stop_everywhere()
            await self._release()
            await self._record("pending", f"the placement its input carried is not the ledger's ({why}); "
                                          "placing it again")

    def _check_names(self, spec: ModelSpec) -> None:
        """Names from whoever started this workflow: checked before any host hears them."""
        inp, plan = self.inp, self.s.plan
        guards.names(instance=inp.name, deployment=inp.deployment)
        if spec.name != inp.deployment:
            raise guards.refuse(f"spec name {spec.name!r} does not match deployment {inp.deployment!r}")
        guards.instance_names(inp.deployment, [inp.name])
        guards.workflow_id(instance_id(inp.name), f"instance name {inp.name!r}")
        if (plan is not None or inp.decision is not None) and not workflow.info().continued_run_id:
            # only this workflow's own continue-as-new carries a placement (booked in the ledger by an
            # earlier run): a new run with one in its input was started by somebody else
            raise guards.refuse(f"instance {inp.name}: a new instance workflow may not bring a placement or a decision "
                                "in its input; placements are booked by the control plane (start it through its "
                                "deployment: gpuflow deploy)")
        if plan is not None:
            guards.names(worker=plan.worker, **{f"subordinate worker {i}": s.worker
                                                for i, s in enumerate(plan.subordinates)})

    def _event(self, kind: str, why: str = "", host: str = "", reached: bool = False) -> m.Event:
        return m.Event(kind=kind, now=workflow.now(), why=why, host=host, reached=reached,
                       split=workflow.info().is_continue_as_new_suggested())

    async def _live(self, spec: ModelSpec) -> None:
        """Until it is stopped: ask ``step`` what next, do it, tell ``step`` what came of it."""
        event = self._event("next")
        while True:
            self.s, action = m.step(self.s, event, self.t)
            if action.kind == m.TEARDOWN:
                return
            event = await self._do(action, spec)

    async def _do(self, a: m.Action, spec: ModelSpec) -> m.Event:
        """One action's I/O; the event it came to (``next`` unless it placed or ran the replica)."""
        s = self.s
        if a.kind == m.GIVE_WAY:
            await self._give_way()
        elif a.kind == m.CONTINUE_AS_NEW:
            workflow.continue_as_new(self.inp.model_copy(update={"restarts": s.restarts, "placement": s.plan,
                                                                 "decision": s.decision}))
        elif a.kind == m.PLACE:
            if await self._place(spec):
                return self._event("placed")
        elif a.kind == m.LAUNCH:
            kind, why, host, reached = await self._run_on_host(spec, a.seconds, quiet=a.quiet)
            return self._event(kind, why, host, reached)
        elif a.kind == m.RECORD:
            await self._record(a.state, a.reason)
        elif a.kind == m.RETRY:
            await workflow.sleep(c.secs(a.seconds))
        elif a.kind == m.ABANDON_HOST:
            await self._abandon_host(a.host)
        elif a.kind == m.LET_GO:
            await self._let_go(a.reason)
        elif a.kind == m.GIVE_UP:
            await self._give_up(a.reason)
        elif a.kind == m.WAIT_RESTART:
            await self._record(a.state, a.reason)
            try:
                await workflow.wait_condition(lambda: s.stop_requested or s.preempted is not None,
                                              timeout=c.secs(a.seconds))
            except asyncio.TimeoutError:
                pass
        return self._event("next")

    async def _abandon_host(self, lost: str) -> None:
        if self.s.plan.subordinates:
            await self._stop_everywhere()  # the hosts that still answer let go of their parts
        await self._release()
        await self._record("pending", f"host {lost} unreachable for {self.t.unreachable_grace_s:g} s; "
                                      "reservation released, placing elsewhere")

    async def _let_go(self, reason: str) -> None:
        """The placement it holds is not what the ledger holds: drop it (whatever is left of the
        booking is released) and wait PENDING to be placed again."""
        await self._release()
        await self._record("pending", reason)

    async def _teardown(self) -> None:
        s = self.s
        await self._record("stopping")
        if s.plan is not None:
            if not s.processes_stopped:
                await self._stop_everywhere()
            await self._release()
        s.pid = s.port = s.address = s.kv_events_port = s.key_id = None
        s.launch_mac = ""
        await self._record("deleted", f"not placed: {self.unwanted}" if self.unwanted else "")
        try:
            await workflow.get_external_workflow_handle(deployment_id(self.inp.deployment)).signal(
                DEPLOYMENT_INSTANCE_ENDED, self.inp.name)
        except Exception:  # noqa: BLE001  the deployment may be gone already
            pass
