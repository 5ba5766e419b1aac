"""Placing one replica, in the instance workflow: estimate, decide, book.

Estimate (a regular activity: it may read files for minutes, in a process that is killed when the
replica is stopped), then decide and book. Since the ``place-in-one`` patch, deciding and booking
are one activity (``place_replica``): the decision is booked in the same call, and a plan the
ledger refuses (the capacity moved) is decided again there, and the booking writes the row
SCHEDULED with the decision. A spec that states its resources is costed there too (nothing to
read), without an estimate activity or an ANALYZING record: a replica of such a spec is placed in
one activity round trip where it took three, and two store writes fewer. A replica that does not
fit waits PENDING with its reasons until it is woken (a release, a host, the queue's sweep); one
placed by preemption goes through preempt_steps."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as TemporalTimeout

with workflow.unsafe.imports_passed_through():
    from contracts.control import DecisionRecord, EstimateRecord, PlaceResult, ReserveResult
    from scheduler.estimate import needs_files, states_resources
    from scheduler.reasons import pending_text
    from scheduler.spec import ModelSpec
    from workflows import common as c
    from workflows import model_read, preempt_steps

PATCH = "place-in-one"  # decide and book in one activity
# A spec that states its resources is placed by a local activity: run by the worker that runs the
# workflow task, inside it. Its semantics fit: the call reads nothing from files (nothing to cost), is
# short (a decision and one transaction), and is idempotent in effect (at-least-once: a re-run that
# finds the replica booked replaces its ledger lines in one transaction, so it never holds two). The
# task that placed it goes on to record STARTING and schedule the launch: one workflow task and one
# task-queue round trip fewer per replica. A spec costed from files keeps the regular activity: its
# estimate may be cached only in the worker that ran the estimate activity.
PLACE_LOCAL = "place-local"
QUEUE_SWEEP = "queue-sweep"  # a PENDING replica waits for a wake (the sweep included) without a timer of its own


def hub_source(spec: ModelSpec) -> bool:
    """Its files come from a hub: the launch waits for a download (recorded DOWNLOADING) first."""
    return bool(spec.source.huggingface or spec.source.modelscope)


def backoff(n: int, base: float, cap: float) -> float:
    """Seconds before try n (1-based): min(base * 2^(n-1), cap), for any n: the exponent stops at 64
    (the cap, at most 30 days, has long won by then; 2 ** 1029 once overflowed the float, and
    the workflow task failed forever)."""
    return min(base * 2 ** min(max(n - 1, 0), 64), cap)


async def place(wf, spec: ModelSpec) -> bool:
    """Estimate, decide, book. True once a placement is held; False when stopping."""
    folded = c.patched(wf.inp, PATCH)
    quick = folded and states_resources(spec)  # nothing to read or estimate: ANALYZING would last no time
    if not quick:
        await wf._record("analyzing")
    inputs = None  # a local path as a GPU host read it (model_read.py): passed to every costing activity
    if needs_files(spec) and c.patched(wf.inp, model_read.PATCH):
        inputs = await model_read.read_model(wf, spec)
        if inputs is None:
            return False
    extra = [inputs] if inputs is not None else []
    est: EstimateRecord | None = None
    if not quick:  # a spec that states its resources is costed by the place activity
        est = await _estimate(wf, extra)
        if est is None:
            return False
    # Generation 2: a replica launched in the task that places it (nothing to download first) is
    # booked STARTING, not SCHEDULED then STARTING: one store write and one local activity fewer.
    then = "starting" if quick and c.generation(wf.inp, 2) and not hub_source(spec) else "scheduled"
    while not wf.stop_requested:
        wf.woken = False
        booked: ReserveResult | None = None
        try:
            if folded:
                if quick and c.patched(wf.inp, PLACE_LOCAL):
                    args = [wf.inp.name, wf.inp.spec] + ([None, then] if then != "scheduled" else [])
                    got: PlaceResult = await workflow.execute_local_activity(
                        c.PLACE_REPLICA, args=args, result_type=PlaceResult,
                        **c.STORE_LOCAL, summary=f"place {wf.inp.name}")
                else:
                    got = await workflow.execute_activity(
                        c.PLACE_REPLICA, args=[wf.inp.name, wf.inp.spec, *extra], result_type=PlaceResult,
                        start_to_close_timeout=c.secs(120), heartbeat_timeout=c.CONTROL_HEARTBEAT,
                        summary=f"place {wf.inp.name}")
                d, booked, est = got.decision, got.booked, est or got.estimate
            else:
                d = await workflow.execute_activity(
                    c.DECIDE_PLACEMENT, args=[wf.inp.name, wf.inp.spec, *extra], result_type=DecisionRecord,
                    start_to_close_timeout=c.secs(120), heartbeat_timeout=c.CONTROL_HEARTBEAT,
                    summary=f"decide {wf.inp.name}")
        except (ActivityError, ApplicationError, TemporalTimeout) as e:  # a local activity's failure arrives unwrapped
            await wf._give_up(f"cannot place the model: {c.cause(e)[1]}")
            return False
        wf.decision = d
        if booked is None and (not d.scheduled or d.plan is None):
            await _wait(wf, d, est)
            if inputs is not None and not wf.stop_requested:  # a host that joined may hold the path
                inputs = await model_read.read_model(wf, spec)
                if inputs is None:
                    return False
                extra = [inputs]
            continue
        if booked is None and d.victims and c.patched(wf.inp, preempt_steps.PATCH):
            got_it = await preempt_steps.preempt(wf, d, est)
            if got_it is None:
                continue  # a victim or the capacity moved: decide again
            return got_it
        if booked is None:
            try:
                booked = await workflow.execute_activity(
                    c.RESERVE_PLACEMENT, args=[wf.inp.name, wf.inp.spec, d, *extra], result_type=ReserveResult,
                    start_to_close_timeout=c.secs(120), heartbeat_timeout=c.CONTROL_HEARTBEAT,
                    retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=5),
                                             non_retryable_error_types=["StaleDecision"]))
            except ActivityError as e:
                if c.cause(e)[0] == "StaleDecision":
                    continue  # capacity moved since the snapshot: decide again on a fresh one
                await wf._give_up(f"cannot book the placement: {c.cause(e)[1]}")
                return False
        wf.plan, wf.preempted_why = booked.plan, ""
        if folded and then == "starting":  # the booking wrote the row STARTING (or a re-run of it did)
            wf._recorded_by_store("starting", "", attributes=True)
        elif folded:  # the booking wrote the row SCHEDULED, with the decision; the launch's record upserts the state
            wf._recorded_by_store("scheduled", f"{d.strategy}: score {d.score}")
        else:
            await wf._record("scheduled", f"{d.strategy}: score {d.score}",
                             decision={"request": est.summary, "strategy": d.strategy, "score": d.score,
                                       "placement": booked.plan.model_dump(mode="json")})
        return True
    return False


async def _estimate(wf, extra: list) -> EstimateRecord | None:
    """The model's request; None when stopping (or when the model itself is wrong: ERROR until a
    new spec). A hub that does not answer is asked again with backoff."""
    tries = 0
    while True:
        h = workflow.start_activity(
            c.ESTIMATE_MODEL, args=[wf.inp.spec, *extra], result_type=EstimateRecord,
            start_to_close_timeout=c.secs(600), heartbeat_timeout=c.CONTROL_HEARTBEAT,
            retry_policy=RetryPolicy(maximum_attempts=3, non_retryable_error_types=["ModelError", "InvalidSpec"]))
        await workflow.wait_condition(lambda: h.done() or wf.stop_requested)
        if not h.done():  # stopped while estimating: the estimate is cancelled (its process killed)
            h.cancel()
            return None
        try:
            return await h
        except ActivityError as e:
            kind, msg = c.cause(e)
            if kind != "HubUnreachable":  # the model itself is wrong: wait for a new spec
                await wf._record("error", f"cannot estimate the model: {msg}")
                await workflow.wait_condition(lambda: wf.stop_requested)
                return None
            tries += 1  # the hub did not answer: try again later
            delay = backoff(tries, wf.t.restart_base_s, wf.t.restart_cap_s)
            await wf._record("error", f"cannot estimate the model: {msg}; trying again in {delay:g} s")
            try:
                await workflow.wait_condition(lambda: wf.stop_requested, timeout=c.secs(delay))
                return None
            except asyncio.TimeoutError:
                pass


async def _wait(wf, d: DecisionRecord, est: EstimateRecord) -> None:
    """PENDING with the decision's reasons until woken: a release, a host, or the queue's periodic
    sweep (workflows/queue_sweep.py); before that patch, by its own timer as well."""
    shown = min(3, d.decision.get("decisive") or 3)  # the decisive reasons lead (scheduler/reasons.py)
    reason = "; ".join(d.reasons[:shown]) or "no candidate"
    parts = [reason, wf.preempted_why] if d.decision.get("quota") else [  # a quota leads, as it is
        wf.preempted_why, pending_text(d.reasons, d.decision.get("decisive"))]  # as the PENDING queue says it
    await wf._record("pending", "; ".join(x for x in parts if x),
                     decision={"request": est.summary, "reasons": d.reasons[:20]})
    timeout = None if c.patched(wf.inp, QUEUE_SWEEP) else c.secs(wf.t.pending_recheck_s)
    try:
        await workflow.wait_condition(lambda: wf.woken or wf.stop_requested, timeout=timeout)
    except asyncio.TimeoutError:
        pass
