"""The control plane's activities (task queue ``gpuflow-control``): the store, estimation, the
policy, the ledger, and starting/signalling workflows. Blocking database and file work runs in
a thread pool; the Temporal client is used for signals and starts."""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy.engine import Engine
from temporalio import activity
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from activities.payloads import (CONTROL_QUEUE, ClosedInstance, DecisionRecord, EstimateRecord, HostReport, InstanceInput,
                                 InstanceRecord, PlacementPlan, ReserveResult, ScaleDownOrder)
from activities.hub_headers import HubUnreachable, header_copy
from activities.metrics import ControlMetrics
from activities.store import ledger, records
from activities.store.snapshot_cache import SnapshotCache
from scheduler import scale_down
from scheduler.decide import decide
from scheduler.errors import GpuflowError
from scheduler.estimate import estimate_request
from scheduler.policy_config import PolicyConfig
from scheduler.request import Request
from scheduler.spec import ModelSpec, PlacementStrategy
from scheduler.summary import request_summary, summary_text
from activities import names as c

TOP_CANDIDATES = 10


class EstimateCache:
    """Requests by spec and file mtime: a model is costed once, not once per decision."""

    def __init__(self, hub_cache: str | None = None, hf_endpoint: str | None = None) -> None:
        self._d: dict[tuple, Request] = {}
        self._lock = threading.Lock()
        self.hub_cache, self.hf_endpoint = hub_cache, hf_endpoint

    def get(self, spec: ModelSpec) -> Request:
        path = spec.source.local_path
        try:
            stamp = os.stat(path).st_mtime_ns if path else None
        except OSError:
            stamp = None
        key = (spec.model_dump_json(), stamp)
        with self._lock:
            hit = self._d.get(key)
        if hit is not None:
            return hit
        override = None
        if path is None and not (spec.resources and spec.resources.vram is not None) and self.hub_cache:
            override = header_copy(spec.source, self.hub_cache, self.hf_endpoint)  # a hub model: its headers
        req = estimate_request(spec, override)
        with self._lock:
            if len(self._d) > 256:
                self._d.clear()
            self._d[key] = req
        return req


def _spec(raw: dict) -> ModelSpec:
    try:
        return ModelSpec.model_validate(raw)
    except ValueError as e:
        raise ApplicationError(f"invalid model spec: {e}", type="InvalidSpec", non_retryable=True) from None


def decision_record(d, req: Request, workers: int, gens: dict[str, int]) -> DecisionRecord:
    full = d.to_dict()
    ranked = sorted(full["candidates"], key=lambda x: -x.get("score", 0))
    full["candidates"] = ranked[:TOP_CANDIDATES]
    full["candidates_total"] = len(ranked)
    plan = None
    if d.placement is not None:
        p = d.placement
        plan = PlacementPlan(worker=p.worker, gpu_indexes=list(p.gpu_indexes),
                             claim=p.claim.model_dump(exclude_none=True),
                             subordinates=[s.model_dump(exclude_none=True) for s in p.subordinates])
    return DecisionRecord(scheduled=d.scheduled, plan=plan, strategy=d.strategy, score=d.score,
                          reasons=list(d.reasons), request=request_summary(req), decision=full, workers_seen=workers,
                          generations=gens)


class ControlActivities:
    def __init__(self, engine: Engine, client: Client, policy: PolicyConfig | None = None, threads: int = 16,
                 metrics: ControlMetrics | None = None, hub_cache: str | None = None, hf_endpoint: str | None = None):
        self.engine, self.client = engine, client
        self.metrics = metrics or ControlMetrics()
        self.policy = policy or PolicyConfig()
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="gpuflow-store")
        self.estimates = EstimateCache(hub_cache, hf_endpoint)
        self.snapshots = SnapshotCache()  # refreshed incrementally by each decision

    def all(self) -> list:
        return [self.save_deployment, self.record_instance, self.estimate_model, self.decide_placement,
                self.reserve_placement, self.release_placement, self.start_instances, self.rank_scale_down,
                self.closed_workflows, self.host_seen, self.host_lost]

    async def _db(self, fn, *args):
        """Run blocking store/file work in the pool, heartbeating meanwhile: a control-plane
        worker that dies mid-call is noticed within the heartbeat timeout, not start-to-close."""
        fut = asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)
        while True:
            done, _ = await asyncio.wait({fut}, timeout=1.0)
            if done:
                return fut.result()
            activity.heartbeat()

    async def wake_pending(self) -> int:
        """Signal every PENDING instance that capacity changed, so it decides again now."""
        names = await self._db(records.pending_instances, self.engine)
        for n in names:
            activity.heartbeat()
            try:
                await self.client.get_workflow_handle(f"instance/{n}").signal("capacity_changed")
            except RPCError:
                pass  # ended meanwhile
        return len(names)

    @activity.defn(name=c.SAVE_DEPLOYMENT)
    async def save_deployment(self, name: str, spec: dict, replicas: int, state: str) -> None:
        await self._db(records.save_deployment, self.engine, name, spec, replicas, state)

    @activity.defn(name=c.RECORD_INSTANCE)
    async def record_instance(self, rec: InstanceRecord) -> None:
        await self._db(records.record_instance, self.engine, rec)

    @activity.defn(name=c.ESTIMATE_MODEL)
    async def estimate_model(self, raw: dict) -> EstimateRecord:
        spec = _spec(raw)
        try:
            req = await self._db(self.estimates.get, spec)
        except HubUnreachable as e:
            raise ApplicationError(str(e), type="HubUnreachable") from None
        except GpuflowError as e:
            raise ApplicationError(str(e), type="ModelError", non_retryable=True) from None
        s = request_summary(req)
        return EstimateRecord(model=spec.name, request=s, summary=summary_text(s))

    @activity.defn(name=c.DECIDE_PLACEMENT)
    async def decide_placement(self, instance: str, raw: dict) -> DecisionRecord:
        spec = _spec(raw)

        try:
            return await self._db(self._decide, instance, spec)
        except GpuflowError as e:
            raise ApplicationError(str(e), type="ModelError", non_retryable=True) from None

    def _decide(self, instance: str, spec: ModelSpec, bind=None) -> DecisionRecord:
        req = self.estimates.get(spec)
        bind = bind if bind is not None else self.engine
        with self.metrics.decision_seconds.time():
            snap, gens = self.snapshots.refresh(bind)  # gens read first: a change meanwhile reads as stale
            d = decide(snap, spec, req, self.policy, exclude=instance)
        self.metrics.decisions.labels("scheduled" if d.scheduled else "unschedulable").inc()
        return decision_record(d, req, len(snap.workers), gens)

    @activity.defn(name=c.RESERVE_PLACEMENT)
    async def reserve_placement(self, instance: str, raw: dict, d: DecisionRecord) -> ReserveResult:
        spec = _spec(raw)
        remade: list[DecisionRecord] = []

        def redecide(session) -> PlacementPlan | None:
            fresh = self._decide(instance, spec, session)
            remade.append(fresh)
            return fresh.plan if fresh.scheduled else None

        try:
            plan, now = await self._db(ledger.reserve, self.engine, instance, d.plan, d.generations, redecide)
        except ledger.StaleDecision as e:
            self.metrics.conflicts.labels("rejected").inc()
            raise ApplicationError(str(e), type="StaleDecision", non_retryable=True) from None
        if remade:
            self.metrics.conflicts.labels("remade").inc()
        return ReserveResult(plan=plan, booked_now=now, remade=remade[-1] if remade else None)

    @activity.defn(name=c.RELEASE_PLACEMENT)
    async def release_placement(self, instance: str) -> int:
        n = await self._db(ledger.release, self.engine, instance)
        if n:
            await self.wake_pending()
        return n

    @activity.defn(name=c.START_INSTANCES)
    async def start_instances(self, inputs: list[InstanceInput]) -> None:
        for inp in inputs:
            activity.heartbeat()
            await self._db(records.create_instance, self.engine, InstanceRecord(
                name=inp.name, deployment=inp.deployment, model=str(inp.spec.get("name", "")), state="pending"))
            await self.client.start_workflow(
                "ModelInstanceWorkflow", inp, id=f"instance/{inp.name}", task_queue=CONTROL_QUEUE,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                static_summary=f"replica {inp.name} of {inp.deployment}")

    @activity.defn(name=c.RANK_SCALE_DOWN)
    async def rank_scale_down(self, model: str, strategy: str, live: list[str]) -> ScaleDownOrder:
        def run() -> ScaleDownOrder:
            snap = self.snapshots.refresh(self.engine)[0]
            ranked = scale_down.rank(snap, model, PlacementStrategy(strategy), self.policy)
            order = [r.instance.name for r in ranked if r.instance.name in live]
            missing = [n for n in live if n not in order]  # not in the store yet: nothing placed, remove first
            return ScaleDownOrder(order=missing + order, ranking=[r.to_dict() for r in ranked if r.instance.name in live])

        return await self._db(run)

    @activity.defn(name=c.CLOSED_WORKFLOWS)
    async def closed_workflows(self, names: list[str]) -> list[ClosedInstance]:
        """Which of these instances' workflows are not running. One that ended without its own
        teardown (terminated from the UI, say) has its reservation released here and is
        recorded deleted; the caller stops its process on the host."""
        closed: list[ClosedInstance] = []
        released = 0
        for n in names:
            activity.heartbeat()
            try:
                d = await self.client.get_workflow_handle(f"instance/{n}").describe()
                status = d.status.name if d.status is not None else "UNKNOWN"
            except RPCError:
                status = "NOT_FOUND"
            if status == "RUNNING":
                continue
            held = await self._db(ledger.workers_of, self.engine, n)
            worker = await self._db(records.mark_gone, self.engine, n, f"its workflow ended: {status}")
            released += await self._db(ledger.release, self.engine, n)
            hosts = ([worker] if worker else []) + [w for w in held if w != worker]
            closed.append(ClosedInstance(name=n, status=status, worker=worker, hosts=hosts))
        if released:
            await self.wake_pending()
        return closed

    @activity.defn(name=c.HOST_SEEN)
    async def host_seen(self, report: HostReport) -> None:
        if await self._db(records.upsert_worker, self.engine, report, "ready"):
            await self.wake_pending()

    @activity.defn(name=c.HOST_LOST)
    async def host_lost(self, name: str, reason: str) -> None:
        await self._db(records.set_worker_state, self.engine, name, "not_ready", reason)
