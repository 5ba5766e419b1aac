"""Placing one replica, in the instance workflow: estimate, decide, book.

A spec costed from files is estimated first (ANALYZING; a regular activity: it may read files for
minutes, in a process that is killed when the replica is stopped). Then one activity
(``place_replica``) decides and books: a plan the ledger refuses (the capacity moved) is decided
again there, and the booking writes the row SCHEDULED with the decision. A spec that states its
resources is costed there too (nothing to read), without an estimate activity or an ANALYZING
record, by a local activity, and booked STARTING when its launch follows in the same workflow
task. A replica that does not fit waits PENDING with its reasons until it is woken (a release, a
host, the queue's sweep); one placed by preemption goes through preempt_steps.py."""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as TemporalTimeout

with workflow.unsafe.imports_passed_through():
    from contracts.control import DecisionRecord, EstimateRecord, PlaceResult
    from contracts.placement import EstimateAsk, PlaceAsk
    from contracts.estimate_inputs import EstimateInputs
    from scheduler.estimate import needs_files, states_resources
    from scheduler.reasons import pending_text
    from scheduler.spec import ModelSpec
    from workflows import common as c
    from workflows.instance_machine import backoff
    from workflows.model_read import ModelRead
    from workflows.preempt_steps import PreemptSteps


def hub_source(spec: ModelSpec) -> bool:
    """Its files come from a hub: the launch waits for a download (recorded DOWNLOADING) first."""
    return bool(spec.source.huggingface or spec.source.modelscope)


def pending_reason(d: DecisionRecord, preempted_why: str) -> str:
    """What a replica that does not fit shows while it waits: a quota leads, as it is; otherwise
    the decisive reasons as the PENDING queue says them (scheduler/reasons.py), after the
    preemptor's name when it was preempted."""
    if d.quota:
        shown = min(3, d.decisive or 3)  # the decisive reasons lead
        parts = ["; ".join(d.reasons[:shown]) or "no candidate", preempted_why]
    else:
        parts = [preempted_why, pending_text(d.reasons, d.decisive)]
    return "; ".join(x for x in parts if x)


class PlaceSteps(ModelRead, PreemptSteps):
    async def _place(self, spec: ModelSpec) -> bool:
        """Estimate, decide, book. True once a placement is held; False when stopping."""
        s, name = self.s, self.inp.name
        quick = states_resources(spec)  # nothing to read or estimate: ANALYZING would last no time
        if not quick:
            await self._record("analyzing")
        inputs = None  # a local path as a GPU host read it (model_read.py): passed to every costing activity
        if needs_files(spec):
            inputs = await self._read_model(spec)
            if inputs is None:
                return False
        est: EstimateRecord | None = None
        if not quick:  # a spec that states its resources is costed by the place activity
            est = await self._estimate(inputs)
            if est is None:
                return False
        # A replica launched in the task that places it (nothing to download first) is booked
        # STARTING, not SCHEDULED then STARTING: one store write and one local activity fewer.
        then = "starting" if quick and not hub_source(spec) else "scheduled"
        while not s.stop_requested:
            s.woken = False
            ask = PlaceAsk(instance=name, spec=self.inp.spec, inputs=inputs, then=then)
            try:
                if quick:
                    # A local activity, run by the worker that runs the workflow task, inside it: the
                    # call reads nothing from files, is short (a decision and one transaction), and is
                    # idempotent in effect (a re-run that finds the replica booked replaces its ledger
                    # lines in one transaction). A spec costed from files keeps the regular activity:
                    # its estimate may be cached only in the worker that ran the estimate activity.
                    got: PlaceResult = await workflow.execute_local_activity(
                        c.PLACE_REPLICA, ask, result_type=PlaceResult,
                        **c.STORE_LOCAL, summary=f"place {name}")
                else:
                    got = await workflow.execute_activity(
                        c.PLACE_REPLICA, ask, result_type=PlaceResult,
                        start_to_close_timeout=c.secs(120), heartbeat_timeout=c.CONTROL_HEARTBEAT,
                        summary=f"place {name}")
            except (ActivityError, ApplicationError, TemporalTimeout) as e:  # a local activity's failure arrives unwrapped
                kind, why = c.cause(e)
                if kind == "NotWanted":  # not one its deployment wants (started by hand, or going): it ends
                    self.unwanted, s.stop_requested = why, True
                    return False
                await self._give_up(f"cannot place the model: {why}")
                return False
            d, booked, est = got.decision, got.booked, est or got.estimate
            s.decision = d
            if booked is not None:
                s.plan, s.preempted_why = booked.plan, ""
                if then == "starting":  # the booking wrote the row STARTING (or a re-run of it did)
                    self._recorded_by_store("starting", "", attributes=True)
                else:  # the booking wrote the row SCHEDULED, with the decision; the launch's record upserts the state
                    self._recorded_by_store("scheduled", f"{d.strategy}: score {d.score}")
                return True
            if d.scheduled and d.plan is not None and d.victims:  # placed by taking the GPUs of others
                got_it = await self._preempt(d, est)
                if got_it is None:
                    continue  # a victim or the capacity moved: decide again
                return got_it
            await self._wait_pending(d, est)
            if inputs is not None and not s.stop_requested:  # a host that joined may hold the path
                inputs = await self._read_model(spec)
                if inputs is None:
                    return False
        return False

    async def _estimate(self, inputs: EstimateInputs | None) -> EstimateRecord | None:
        """The model's request; None when stopping (or when the model itself is wrong: ERROR until a
        new spec). A hub that does not answer is asked again with backoff."""
        s = self.s
        tries = 0
        while True:
            h = workflow.start_activity(
                c.ESTIMATE_MODEL, EstimateAsk(spec=self.inp.spec, inputs=inputs), result_type=EstimateRecord,
                start_to_close_timeout=c.secs(600), heartbeat_timeout=c.CONTROL_HEARTBEAT,
                retry_policy=RetryPolicy(maximum_attempts=3, non_retryable_error_types=["ModelError", "InvalidSpec"]))
            await workflow.wait_condition(lambda: h.done() or s.stop_requested)
            if not h.done():  # stopped while estimating: the estimate is cancelled (its process killed)
                h.cancel()
                return None
            try:
                return await h
            except ActivityError as e:
                kind, msg = c.cause(e)
                if kind != "HubUnreachable":  # the model itself is wrong: wait for a new spec
                    await self._record("error", f"cannot estimate the model: {msg}")
                    await workflow.wait_condition(lambda: s.stop_requested)
                    return None
                tries += 1  # the hub did not answer: try again later
                delay = backoff(tries, self.t.restart_base_s, self.t.restart_cap_s)
                await self._record("error", f"cannot estimate the model: {msg}; trying again in {delay:g} s")
                try:
                    await workflow.wait_condition(lambda: s.stop_requested, timeout=c.secs(delay))
                    return None
                except asyncio.TimeoutError:
                    pass

    async def _wait_pending(self, d: DecisionRecord, est: EstimateRecord) -> None:
        """PENDING with the decision's reasons until woken: a release, a host, or the queue's
        periodic sweep (workflows/queue_sweep.py). It keeps no timer of its own."""
        s = self.s
        await self._record("pending", pending_reason(d, s.preempted_why),
                           decision=d.pending_row(est.summary))
        await workflow.wait_condition(lambda: s.woken or s.stop_requested)
