"""The placement activities (task queue ``gpuflow-control``): cost a model, place a replica (decide
and book it in the ledger in one call), book a preemption, release a booking, and rank replicas for
a scale-down. Each takes one input from contracts/placement.py (or contracts/control.py). The
decisions themselves are the Decider's (activities/decider.py), shared with every other path that
decides (the PENDING queue's wake); the place activity's calls are batched (activities/place_batch.py)."""

from __future__ import annotations

import asyncio
import threading
from typing import Awaitable, Callable

from sqlalchemy.engine import Engine
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.batch import Batch
from activities.claims_read import ClaimsReader
from activities.decider import Decider
from activities.estimate_cache import EstimateCache
from activities.hub_headers import HubUnreachable
from activities.metrics import ControlMetrics
from activities.place_batch import Placing
from activities.runner import Runner
from activities import callers
from contracts import decision_of
from contracts import activity_names as c
from contracts.control import (EstimateRecord, InstanceNames, InstanceRef, PlaceResult, RequestSummary, ReserveResult,
                               ScaleDownOrder)
from contracts.placement import EstimateAsk, PlaceAsk, PreemptAsk, ScaleDownAsk
from scheduler.errors import GpuflowError
from scheduler.spec import ModelSpec
from scheduler.summary import request_summary, summary_text
from store import ledger, records

PLACE_TRIES = 3  # decisions the place activity makes while the ledger refuses its plans, before it fails and is retried


def valid_spec(raw: dict) -> ModelSpec:
    """``raw`` as a ModelSpec; one that does not validate fails the activity for good (its fault)."""
    try:
        return ModelSpec.model_validate(raw)
    except ValueError as e:
        raise ApplicationError(f"invalid model spec: {e}", type="InvalidSpec", non_retryable=True) from None


class PlacementActivities:
    def __init__(self, engine: Engine, runner: Runner, estimates: EstimateCache, decider: Decider,
                 placing: Batch[Placing, PlaceResult | None], metrics: ControlMetrics,
                 wake: Callable[[], Awaitable[int]], claims: ClaimsReader | None = None):
        """``placing``: the place activity's batches (place_batch.place_batches); ``wake``: the
        PENDING queue's wake (wake_queue.Waker), after a release; ``claims``: the learned claims a
        new placement books under mode apply (activities/claims_read.py; None: the estimate)."""
        self.engine, self.runner, self.estimates, self.decider = engine, runner, estimates, decider
        self.placing, self.metrics, self.wake, self.claims = placing, metrics, wake, claims

    def all(self) -> list:
        return [self.estimate_model, self.place_replica, self.preempt_placement, self.victims_left,
                self.release_placement, self.rank_scale_down]

    @activity.defn(name=c.ESTIMATE_MODEL)
    async def estimate_model(self, ask: EstimateAsk) -> EstimateRecord:
        spec = valid_spec(ask.spec)
        cancel = threading.Event()  # set when the activity is cancelled: the estimate's process is killed
        try:
            req = await self.runner.run(self.estimates.get, spec, ask.inputs, cancel, cancel=cancel)
        except HubUnreachable as e:
            raise ApplicationError(str(e), type="HubUnreachable") from None
        except GpuflowError as e:
            raise ApplicationError(str(e), type="ModelError", non_retryable=True) from None
        s = request_summary(req)
        return EstimateRecord(model=spec.name, request=RequestSummary.model_validate(s), summary=summary_text(s))

    @activity.defn(name=c.PLACE_REPLICA)
    async def place_replica(self, ask: PlaceAsk) -> PlaceResult:
        """Decide and book in one call (workflows/place_steps.py), with the calls that arrive
        together (activities/place_batch.py); the booking records the row SCHEDULED with the
        decision, as the workflow's own record did; or STARTING (``ask.then``, with no reason, as
        the workflow's record of STARTING wrote it), when the workflow launches in the same task:
        one store write and one local activity fewer per replica. A plan the ledger refuses (the
        capacity moved since the snapshot) is decided again, up to PLACE_TRIES times; then the
        activity fails and is retried with backoff. A decision that does not place the replica
        outright (it does not fit, a quota, victims to preempt) is returned unbooked. An instance
        that is not one its deployment wants fails it for good (NotWanted, non-retryable)."""
        callers.check(c.PLACE_REPLICA, ask)
        spec, instance, then = valid_spec(ask.spec), ask.instance, ask.then
        if then not in ("scheduled", "starting"):
            raise ApplicationError(f"a booking records SCHEDULED or STARTING, not {then!r}", type="InvalidInput",
                                   non_retryable=True)
        try:  # costed before it joins a batch (cached: the estimate activity costed a spec read from files)
            req = await self.runner.run(self.estimates.get, spec, ask.inputs)
        except GpuflowError as e:
            raise ApplicationError(str(e), type="ModelError", non_retryable=True) from None
        if self.claims is not None:  # under mode apply, a confident learned claim in place of the estimate
            req = await self.runner.run(self.claims.apply, spec, req)
        for _ in range(PLACE_TRIES):
            fut = self.placing.submit(Placing(instance, spec, req, then))
            try:
                got = await self.runner.heartbeating(fut)
            except asyncio.CancelledError:
                fut.cancel()  # not placed yet: its batch drops it
                raise
            except ledger.NotWanted as e:  # started by hand, or its deployment is going: never placed
                raise ApplicationError(str(e), type="NotWanted", non_retryable=True) from None
            except GpuflowError as e:
                raise ApplicationError(str(e), type="ModelError", non_retryable=True) from None
            if got is not None:
                await self.wake(taken=True)  # capacity taken: the waiting replicas' reasons follow (pending_reasons.py)
                return got
        raise ApplicationError(f"instance {instance}: the capacity moved under {PLACE_TRIES} decisions in a row",
                               type="StaleDecision")

    @activity.defn(name=c.PREEMPT_PLACEMENT)
    async def preempt_placement(self, ask: PreemptAsk) -> ReserveResult:
        """Book the decision's plan by taking its victims' GPUs, in one ledger transaction
        (ledger.preempt); StaleDecision when a victim no longer holds what the decision assumed,
        or it no longer fits. The names were validated with the input (scheduler.bounds.Name)."""
        callers.check(c.PREEMPT_PLACEMENT, ask)
        instance, d = ask.instance, ask.decision
        if d.plan is None or not d.victims:
            raise ApplicationError("a preemption needs a plan and victims", type="InvalidInput", non_retryable=True)
        why = decision_of.notice(d, instance).reason
        try:
            plan, now = await self.runner.run(ledger.preempt, self.engine, instance, d.plan,
                                              {v.name: v.plan for v in d.victims}, why)
        except ledger.StaleDecision as e:
            self.decider.refused(instance)  # its victims are no longer assumed gone
            raise ApplicationError(str(e), type="StaleDecision", non_retryable=True) from None
        except ledger.NotWanted as e:
            self.decider.snapshots.forget(instance)
            raise ApplicationError(str(e), type="NotWanted", non_retryable=True) from None
        if now:
            for v in d.victims:
                self.metrics.preemptions.labels(d.tenant, v.tenant).inc()
        return ReserveResult(plan=plan, booked_now=now)

    @activity.defn(name=c.VICTIMS_LEFT)
    async def victims_left(self, victims: InstanceNames) -> InstanceNames:
        """Which of these preempted instances may still run a process (records.preempted_running)."""
        return InstanceNames(names=await self.runner.run(records.preempted_running, self.engine, victims.names))

    @activity.defn(name=c.RELEASE_PLACEMENT)
    async def release_placement(self, ref: InstanceRef) -> int:
        """The instance's ledger lines released (how many); the PENDING queue is woken for them."""
        callers.check(c.RELEASE_PLACEMENT, ref)
        n = await self.runner.run(ledger.release, self.engine, ref.instance)
        if n or activity.info().attempt > 1:  # a retry finds nothing left to release, but the first try's wake may be lost
            await self.wake()
        return n

    @activity.defn(name=c.RANK_SCALE_DOWN)
    async def rank_scale_down(self, ask: ScaleDownAsk) -> ScaleDownOrder:
        return await self.runner.run(self.decider.scale_down_order, ask.model, ask.strategy.value, ask.live)
