"""Placing one replica, in the instance workflow: the I/O of each placing action the pure machine
names (workflows/place_machine.py has the rows: what follows what, the backoffs, the waits).

- CHECK_HELD / DISOWN: a placement carried across continue-as-new is kept only when the ledger
  holds exactly it (held_plan); otherwise whatever it names is stopped and released.
- ESTIMATE: a regular activity (it may read files for minutes, in a process that is killed when
  the replica is stopped: a stop cancels it).
- DECIDE: one activity (``place_replica``) decides and books; a plan the ledger refuses (the
  capacity moved) is decided again there, and the booking writes the row. A spec that states its
  resources is costed there too, by a local activity, and booked STARTING when its launch follows
  in the same workflow task. BOOKED: this workflow follows the row the booking wrote.
Reading a local path is model_read.py's; preempting, preempt_steps.py's."""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as TemporalTimeout

with workflow.unsafe.imports_passed_through():
    from contracts.control import EstimateRecord, PlaceResult
    from contracts.host import HeldAsk
    from contracts.placement import EstimateAsk, PlaceAsk
    from scheduler.spec import ModelSpec
    from workflows import common as c
    from workflows.instance_state import Action, Event
    from workflows.model_read import ModelRead
    from workflows.preempt_steps import PreemptSteps


class PlaceSteps(ModelRead, PreemptSteps):
    async def _on_check_held(self, a: Action, spec: ModelSpec) -> Event:
        """A placement in the input is this workflow's own, carried across continue-as-new (the guard
        in ``_check_names``). ``continued_run_id`` says only that some run continued as new into
        this one, and a workflow of anybody's can: so the ledger is asked whether it holds exactly
        it for this instance, a replica its deployment wants (``held``: "" when it does)."""
        why = await workflow.execute_local_activity(
            c.HELD_PLAN, HeldAsk(instance=self.inp.name, plan=self.s.plan), result_type=str, **c.STORE_LOCAL)
        return self._event("held", why=why)

    async def _on_disown(self, a: Action, spec: ModelSpec) -> Event:
        """Whatever the carried placement names is stopped, the ledger's lines (if any) released,
        and the replica placed again (which the ledger refuses to a replica nobody wants)."""
        await self._stop_everywhere()
        await self._release()
        await self._record("pending", a.reason)
        return self._event("next")

    async def _on_estimate(self, a: Action, spec: ModelSpec) -> Event:
        """The model's request (``estimated``), or why not (``estimate_failed``: ``retry`` when the
        hub did not answer); ``next`` when stopped meanwhile (the estimate is cancelled, its
        process killed)."""
        s = self.s
        h = workflow.start_activity(
            c.ESTIMATE_MODEL, EstimateAsk(spec=self.inp.spec, inputs=s.placing.inputs), result_type=EstimateRecord,
            start_to_close_timeout=c.secs(600), heartbeat_timeout=c.CONTROL_HEARTBEAT,
            retry_policy=RetryPolicy(maximum_attempts=3, non_retryable_error_types=["ModelError", "InvalidSpec"]))
        await workflow.wait_condition(lambda: h.done() or s.stop_requested)
        if not h.done():
            h.cancel()
            return self._event("next")
        try:
            return self._event("estimated", estimate=await h)
        except ActivityError as e:
            kind, msg = c.cause(e)
            return self._event("estimate_failed", why=msg, retry=kind == "HubUnreachable")

    async def _on_decide(self, a: Action, spec: ModelSpec) -> Event:
        """Decide and book: ``decided`` (booked, pending or to preempt), ``not_wanted`` or ``place_failed``."""
        name = self.inp.name
        ask = PlaceAsk(instance=name, spec=self.inp.spec, inputs=self.s.placing.inputs, then=a.then)
        try:
            if a.local:
                # A local activity, run by the worker that runs the workflow task, inside it: the
                # call reads nothing from files, is short (a decision and one transaction), and is
                # idempotent in effect (a re-run that finds the replica booked replaces its ledger
                # lines in one transaction). A spec costed from files keeps the regular activity:
                # its estimate may be cached only in the worker that ran the estimate activity.
                got: PlaceResult = await workflow.execute_local_activity(
                    c.PLACE_REPLICA, ask, result_type=PlaceResult, **c.STORE_LOCAL, summary=f"place {name}")
            else:
                got = await workflow.execute_activity(
                    c.PLACE_REPLICA, ask, result_type=PlaceResult, start_to_close_timeout=c.secs(120),
                    heartbeat_timeout=c.CONTROL_HEARTBEAT, summary=f"place {name}")
        except (ActivityError, ApplicationError, TemporalTimeout) as e:  # a local activity's failure arrives unwrapped
            kind, why = c.cause(e)
            return self._event("not_wanted" if kind == "NotWanted" else "place_failed", why=why)
        return self._event("decided", decision=got.decision, estimate=got.estimate,
                           plan=got.booked.plan if got.booked is not None else None,
                           proof=got.proof if got.booked is not None else None)

    async def _on_booked(self, a: Action, spec: ModelSpec) -> Event:
        """The booking wrote the row: STARTING (its search attributes now: that record is skipped),
        or SCHEDULED with the decision (the launch's record upserts the state)."""
        self._recorded_by_store(a.state, a.reason, attributes=a.state == "starting")
        return self._event("placed")

