"""ModelInstanceWorkflow (id ``instance/<name>``): one replica's whole life.

PENDING -> ANALYZING (read, estimate) -> decide and book -> SCHEDULED -> launch on the host's
queue (host_steps.py) -> STARTING -> RUNNING -> supervise (supervise_steps.py). A process exit
gives ERROR and a restart on the same host after min(base * 2^(n-1), cap) seconds. A host that
stops answering gives UNREACHABLE; if it is back within the grace period the process is adopted
(or restarted) there, otherwise the reservation is released and the instance is placed
elsewhere. An unschedulable instance waits PENDING with its reasons until a ``capacity_changed``
signal (a release, a host joining or changing, the queue's sweep). ``stop`` stops the process,
releases the reservation and ends the workflow.

What happens next is decided by a pure function, ``step(state, event)`` (instance_machine.py,
placing's rows in place_machine.py): every retry, wait and preemption is a row of its table.
This class holds the state (one ``InstanceState``), answers the signals, query and search
attributes, and does each action the function names with one small handler (``HANDLERS``, at the
end: action kind -> coroutine); the handlers' I/O lives in the classes it inherits, one per
concern (place_steps.py, model_read.py, preempt_steps.py, host_steps.py, supervise_steps.py).

Preemption (scheduler/tenancy/preemption.py): a decision may place the replica by taking the GPUs
of victims. The ledger moves them in one transaction; the preemptor then signals each victim
``preempt`` and waits for ``victim_stopped`` from each (or the store showing it stopped) before it
launches on those GPUs. A victim drains, stops its processes, and waits PENDING in its own
deployment with the reason ``preempted by prod/chat-0 to reclaim prod's guarantee``.

Its messages, each validated where it arrives (workflows/signals.py; a bad one changes nothing and
is logged and counted): ``stop`` and ``capacity_changed`` take nothing, ``preempt`` a
PreemptNotice, ``victim_stopped`` a VictimStopped, ``host_news`` a HostNews; the ``status`` query
answers an InstanceView.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from contracts.ids import DEPLOYMENT_INSTANCE_ENDED, INSTANCE_CAPACITY_CHANGED, INSTANCE_HOST_NEWS, INSTANCE_PREEMPT, INSTANCE_STATUS, INSTANCE_STOP, INSTANCE_VICTIM_STOPPED, INSTANCE_WORKFLOW, deployment_id, instance_id
    from contracts.control import HostNews, InstanceInput, InstanceView, PreemptNotice, VictimStopped
    from scheduler.naming import name_problem
    from scheduler.spec import ModelSpec
    from workflows import common as c
    from workflows import guards
    from workflows import instance_machine as m
    from workflows import instance_state as k
    from workflows import place_machine
    from workflows import signals
    from workflows.host_steps import HostSteps
    from workflows.inputs import one_input
    from workflows.instance_state import Action, Event, InstanceState
    from workflows.place_steps import PlaceSteps



@workflow.defn(name=INSTANCE_WORKFLOW)
class ModelInstanceWorkflow(PlaceSteps, HostSteps):
    @workflow.init
    def __init__(self, *args: Any) -> None:
        inp = one_input(args, InstanceInput, "ModelInstanceWorkflow")
        self.inp, self.t = inp, inp.timings
        # The state, whole. ``step`` replaces it between actions; within an action it is one
        # object, which the signals below write to.
        self.s = InstanceState(plan=inp.placement, restarts=inp.restarts, decision=inp.decision)

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
        """From a victim of its preemption whose processes stopped (a bare name, as victims sent it
        before, reads as one)."""
        said = signals.one(args, VictimStopped, INSTANCE_VICTIM_STOPPED)
        if said is not None and signals.check(INSTANCE_VICTIM_STOPPED, len(self.s.victims_stopped) < 1000,
                                              "it already heard from 1000 victims"):
            self.s.victims_stopped.add(said.instance)

    @workflow.signal(name=INSTANCE_HOST_NEWS)
    def host_news(self, *args: Any) -> None:
        """From the control plane (checked): a host of the placement was lost, its agent restarted,
        or one of its processes there ended (``exited``, by key and pid). Acted on while it supervises."""
        news = signals.one(args, HostNews, INSTANCE_HOST_NEWS)
        if news is None:
            return
        if news.kind == "exited":
            s = self.s
            if news.key not in s.exits and len(s.exits) >= k.NEWS_MAX:
                s.drop_old_exits()  # full: the ends of no process it runs now go first
            if signals.check(INSTANCE_HOST_NEWS, news.key in s.exits or len(s.exits) < k.NEWS_MAX,
                             f"it already holds the ends of {k.NEWS_MAX} of its processes"):
                s.exits[news.key] = news
        elif signals.check(INSTANCE_HOST_NEWS, news.host in self.s.news or len(self.s.news) < k.NEWS_MAX,
                           f"it already holds news of {k.NEWS_MAX} hosts"):
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
        self.s = self.s.model_copy(update={"source_key": spec.source.key, **place_machine.facts(spec)})
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
        if self.s.unwanted:
            raise ApplicationError(self.s.unwanted, type="NotWanted", non_retryable=True)
        return self.status()

    def _check_names(self, spec: ModelSpec) -> None:
        """Names from whoever started this workflow: checked before any host hears them."""
        inp, plan = self.inp, self.s.plan
        guards.names(instance=inp.name, deployment=inp.deployment)
        if spec.name != inp.deployment:
            raise guards.refuse(f"spec name {spec.name!r} does not match deployment {inp.deployment!r}")
        guards.instance_names(inp.deployment, [inp.name])
        guards.workflow_id(instance_id(inp.name), f"instance name {inp.name!r}")
        if (plan is not None or inp.decision is not None) and not workflow.info().continued_run_id \
                and inp.group != inp.deployment:
            # only this workflow's own continue-as-new carries a placement (booked in the ledger by an
            # earlier run), or a group member's, which its deployment booked with the whole group before it
            # started any member (workflows/group_steps.py): either way CHECK_HELD asks the ledger first
            raise guards.refuse(f"instance {inp.name}: a new instance workflow may not bring a placement or a decision "
                                "in its input; placements are booked by the control plane (start it through its "
                                "deployment: gpuflow deploy)")
        if plan is not None:
            guards.names(worker=plan.worker, **{f"subordinate worker {i}": s.worker
                                                for i, s in enumerate(plan.subordinates)})

    async def _live(self, spec: ModelSpec) -> None:
        """Until it is stopped: ask ``step`` what next, do it (one handler per action), tell ``step``
        what came of it."""
        event = self._event("started")
        while True:
            self.s, action = m.step(self.s, event, self.t)
            if action.kind == k.TEARDOWN:
                return
            event = await HANDLERS[action.kind](self, action, spec)

    # --- the life's handlers: each does one action's I/O and says what it came to ----------------
    async def _on_give_way(self, a: Action, spec: ModelSpec) -> Event:
        await self._give_way()
        return self._event("next")

    async def _on_continue_as_new(self, a: Action, spec: ModelSpec) -> Event:
        """A new run with the placement, the restarts and the decision (it never returns)."""
        s = self.s
        workflow.continue_as_new(self.inp.model_copy(update={"restarts": s.restarts, "placement": s.plan,
                                                             "decision": s.decision}))

    async def _on_launch(self, a: Action, spec: ModelSpec) -> Event:
        kind, why, host, reached = await self._run_on_host(spec, a.seconds, quiet=a.quiet)
        return self._event(kind, why=why, host=host, reached=reached)

    async def _on_record(self, a: Action, spec: ModelSpec) -> Event:
        await self._record(a.state, a.reason)
        return self._event("next")

    async def _on_wait(self, a: Action, spec: ModelSpec) -> Event:
        """``state``/``reason`` recorded (with the decision's row), then a wait ``until``: ``woken``
        after a wait for a wake (however it ended), else ``next``."""
        s = self.s
        await self._record(a.state, a.reason, decision=a.row)
        ends = {"stop": lambda: s.stop_requested, "woken": lambda: s.woken or s.stop_requested,
                "preempted": lambda: s.stop_requested or s.preempted is not None}[a.until]
        try:
            await workflow.wait_condition(ends, timeout=c.secs(a.seconds) if a.seconds else None)
        except asyncio.TimeoutError:
            pass
        return self._event("woken" if a.until == "woken" else "next")

    async def _on_retry(self, a: Action, spec: ModelSpec) -> Event:
        await workflow.sleep(c.secs(a.seconds))
        return self._event("next")

    async def _on_abandon_host(self, a: Action, spec: ModelSpec) -> Event:
        if self.s.plan.subordinates:
            await self._stop_everywhere()  # the hosts that still answer let go of their parts
        await self._release()
        await self._record("pending", f"host {a.host} unreachable for {self.t.unreachable_grace_s:g} s; "
                                      "reservation released, placing elsewhere")
        return self._event("next")

    async def _on_let_go(self, a: Action, spec: ModelSpec) -> Event:
        """The placement it holds is not what the ledger holds: drop it (whatever is left of the
        booking is released) and wait PENDING to be placed again, after ``seconds`` when given (a
        repeated OOM's backoff; a stop or a preemption ends the wait)."""
        await self._release()
        await self._record("pending", a.reason)
        if a.seconds:
            try:
                await workflow.wait_condition(lambda: self.s.stop_requested or self.s.preempted is not None,
                                              timeout=c.secs(a.seconds))
            except asyncio.TimeoutError:
                pass
        return self._event("next")

    async def _on_give_up(self, a: Action, spec: ModelSpec) -> Event:
        await self._give_up(a.reason)
        return self._event("next")

    async def _teardown(self) -> None:
        s = self.s
        await self._record("stopping")
        if s.plan is not None:
            if not s.processes_stopped:
                await self._stop_everywhere()
            await self._release()
        s.pid = s.port = s.address = s.kv_events_port = s.bootstrap_port = s.key_id = None
        s.launch_mac = ""
        await self._record("deleted", f"not placed: {s.unwanted}" if s.unwanted else "")
        try:
            await workflow.get_external_workflow_handle(deployment_id(self.inp.deployment)).signal(
                DEPLOYMENT_INSTANCE_ENDED, self.inp.name)
        except Exception:  # noqa: BLE001  the deployment may be gone already
            pass


W = ModelInstanceWorkflow
# Each action of the machine (workflows/instance_state.py) and the one handler that does it.
HANDLERS = {
    k.GIVE_WAY: W._on_give_way, k.CONTINUE_AS_NEW: W._on_continue_as_new, k.CHECK_HELD: W._on_check_held,
    k.DISOWN: W._on_disown, k.READ_MODEL: W._on_read_model, k.ESTIMATE: W._on_estimate, k.DECIDE: W._on_decide,
    k.BOOKED: W._on_booked, k.PREEMPT: W._on_preempt, k.TELL_VICTIMS: W._on_tell_victims,
    k.WAIT_VICTIMS: W._on_wait_victims, k.ASK_VICTIMS: W._on_ask_victims, k.LAUNCH: W._on_launch,
    k.RECORD: W._on_record, k.WAIT: W._on_wait, k.RETRY: W._on_retry, k.ABANDON_HOST: W._on_abandon_host,
    k.LET_GO: W._on_let_go, k.GIVE_UP: W._on_give_up,
}
