"""The placement activities (task queue ``gpuflow-control``): cost a model, decide where a replica
goes, book it in the ledger (outright, or by preempting), release it, and rank replicas for a
scale-down. The decisions themselves are the Decider's (activities/decider.py), shared with every
other path that decides; the place activity's calls are batched (activities/place_batch.py)."""

from __future__ import annotations

import asyncio
import threading
from typing import Awaitable, Callable

from sqlalchemy.engine import Engine
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.batch import Batch
from activities.decider import Decider
from activities.estimate_cache import EstimateCache
from activities.hub_headers import HubUnreachable
from activities.metrics import ControlMetrics
from activities.place_batch import PlaceAsk
from activities.runner import Runner
from activities import tenancy
from contracts import activity_names as c
from contracts.control import DecisionRecord, EstimateRecord, PlaceResult, ReserveResult, ScaleDownOrder
from scheduler.errors import GpuflowError
from scheduler.estimate_inputs import EstimateInputs
from scheduler.naming import name_problem
from scheduler.spec import ModelSpec
from scheduler.summary import request_summary, summary_text
from store import ledger, records

PLACE_TRIES = 3  # decisions the place activity makes while the ledger refuses its plans, before it fails and is retried


def valid_spec(raw: dict) -> ModelSpec:
    try:
        return ModelSpec.model_validate(raw)
    except ValueError as e:
        raise ApplicationError(f"invalid model spec: {e}", type="InvalidSpec", non_retryable=True) from None


class PlacementActivities:
    def __init__(self, engine: Engine, runner: Runner, estimates: EstimateCache, decider: Decider,
                 placing: Batch[PlaceAsk, PlaceResult | None], metrics: ControlMetrics,
                 wake: Callable[[], Awaitable[int]]):
        """``placing``: the place activity's batches (place_batch.place_batches); ``wake``: the
        PENDING queue's wake (wake_queue.Waker), after a release."""
        self.engine, self.runner, self.estimates, self.decider = engine, runner, estimates, decider
        self.placing, self.metrics, self.wake = placing, metrics, wake

    def all(self) -> list:
        return [self.estimate_model, self.decide_placement, self.place_replica, self.reserve_placement,
                self.preempt_placement, self.victims_left, self.release_placement, self.rank_scale_down]

    @activity.defn(name=c.ESTIMATE_MODEL)
    async def estimate_model(self, raw: dict, inputs: EstimateInputs | None = None) -> EstimateRecord:
        spec = valid_spec(raw)
        cancel = threading.Event()  # set when the activity is cancelled: the estimate's process is killed
        try:
            req = await self.runner.run(self.estimates.get, spec, inputs, cancel, cancel=cancel)
        except HubUnreachable as e:
            raise ApplicationError(str(e), type="HubUnreachable") from None
        except GpuflowError as e:
            raise ApplicationError(str(e), type="ModelError", non_retryable=True) from None
        s = request_summary(req)
        return EstimateRecord(model=spec.name, request=s, summary=summary_text(s))

    @activity.defn(name=c.DECIDE_PLACEMENT)
    async def decide_placement(self, instance: str, raw: dict, inputs: EstimateInputs | None = None) -> DecisionRecord:
        spec = valid_spec(raw)

        def decide() -> DecisionRecord:
            return self.decider.decide(instance, spec, self.estimates.get(spec, inputs))

        try:
            return await self.runner.run(decide)
        except GpuflowError as e:
            raise ApplicationError(str(e), type="ModelError", non_retryable=True) from None

    @activity.defn(name=c.PLACE_REPLICA)
    async def place_replica(self, instance: str, raw: dict, inputs: EstimateInputs | None = None,
                            then: str = "scheduled") -> PlaceResult:
        """Decide and book in one call (workflows/place_steps.py), with the calls that arrive
        together (activities/place_batch.py); the booking records the row SCHEDULED with the
        decision, as the workflow's own record did; or STARTING (``then``, with no reason, as the
        workflow's record of STARTING wrote it), when the workflow launches in the same task: one
        store write and one local activity fewer per replica. A plan the ledger refuses (the
        capacity moved since the snapshot) is decided again, up to PLACE_TRIES times; then the
        activity fails and is retried with backoff. A decision that does not place the replica
        outright (it does not fit, a quota, victims to preempt) is returned unbooked."""
        spec = valid_spec(raw)
        if isinstance(inputs, dict):  # fewer arguments than parameters: the SDK decodes without type hints
            inputs = EstimateInputs.model_validate(inputs)
        if then not in ("scheduled", "starting"):
            raise ApplicationError(f"a booking records SCHEDULED or STARTING, not {then!r}", type="InvalidInput",
                                   non_retryable=True)
        try:  # costed before it joins a batch (cached: the estimate activity costed a spec read from files)
            req = await self.runner.run(self.estimates.get, spec, inputs)
        except GpuflowError as e:
            raise ApplicationError(str(e), type="ModelError", non_retryable=True) from None
        for _ in range(PLACE_TRIES):
            fut = self.placing.submit(PlaceAsk(instance, spec, req, then))
            try:
                got = await self.runner.heartbeating(fut)
            except asyncio.CancelledError:
                fut.cancel()  # not placed yet: its batch drops it
                raise
            except GpuflowError as e:
                raise ApplicationError(str(e), type="ModelError", non_retryable=True) from None
            if got is not None:
                return got
        raise ApplicationError(f"instance {instance}: the capacity moved under {PLACE_TRIES} decisions in a row",
                               type="StaleDecision")

    @activity.defn(name=c.RESERVE_PLACEMENT)
    async def reserve_placement(self, instance: str, raw: dict, d: DecisionRecord,
                                inputs: EstimateInputs | None = None) -> ReserveResult:
        valid_spec(raw)  # a spec that does not validate books nothing
        if isinstance(d, dict):  # called without ``inputs``: the SDK then decodes without type hints
            d = DecisionRecord.model_validate(d)
        if d.plan is None:
            raise ApplicationError("a booking needs a plan", type="InvalidInput", non_retryable=True)
        try:
            plan, now = await self.runner.run(ledger.reserve, self.engine, instance, d.plan)
        except ledger.StaleDecision as e:
            self.decider.refused(instance)
            raise ApplicationError(str(e), type="StaleDecision", non_retryable=True) from None
        return ReserveResult(plan=plan, booked_now=now)

    @activity.defn(name=c.PREEMPT_PLACEMENT)
    async def preempt_placement(self, instance: str, d: DecisionRecord) -> ReserveResult:
        """Book ``d``'s plan by taking its victims' GPUs, in one ledger transaction (ledger.preempt);
        StaleDecision when a victim no longer holds what the decision assumed, or it no longer fits."""
        if d.plan is None or not d.victims:
            raise ApplicationError("a preemption needs a plan and victims", type="InvalidInput", non_retryable=True)
        bad = [v.name for v in d.victims if name_problem(v.name)]
        if bad or name_problem(instance):
            raise ApplicationError(f"bad instance names: {', '.join(bad) or instance}", type="InvalidInput",
                                   non_retryable=True)
        why = tenancy.notice(d, instance).reason
        try:
            plan, now = await self.runner.run(ledger.preempt, self.engine, instance, d.plan,
                                              {v.name: v.plan for v in d.victims}, why)
        except ledger.StaleDecision as e:
            self.decider.refused(instance)  # its victims are no longer assumed gone
            raise ApplicationError(str(e), type="StaleDecision", non_retryable=True) from None
        if now:
            for v in d.victims:
                self.metrics.preemptions.labels(d.tenant, v.tenant).inc()
        return ReserveResult(plan=plan, booked_now=now)

    @activity.defn(name=c.VICTIMS_LEFT)
    async def victims_left(self, names: list[str]) -> list[str]:
        """Which of these preempted instances may still run a process (records.preempted_running)."""
        return await self.runner.run(records.preempted_running, self.engine, names)

    @activity.defn(name=c.RELEASE_PLACEMENT)
    async def release_placement(self, instance: str) -> int:
        n = await self.runner.run(ledger.release, self.engine, instance)
        if n or activity.info().attempt > 1:  # a retry finds nothing left to release, but the first try's wake may be lost
            await self.wake()
        return n

    @activity.defn(name=c.RANK_SCALE_DOWN)
    async def rank_scale_down(self, model: str, strategy: str, live: list[str]) -> ScaleDownOrder:
        return await self.runner.run(self.decider.scale_down_order, model, strategy, live)
