"""The control plane's activities (task queue ``gpuflow-control``): the store, estimation, the
policy, the ledger, and starting/signalling workflows. Blocking database and file work runs in
a thread pool; the Temporal client is used for signals and starts."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy.engine import Engine
from temporalio import activity
from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from contracts.control import (CONTROL_QUEUE, INSTANCE_CODE, ClosedInstance, DecisionRecord, EstimateRecord, HostNews,
                                 HostReport, InstanceInput, InstanceRecord, PlaceResult, PlacementPlan, ReserveResult, ScaleDownOrder)
from activities.estimate_process import estimate_in_child
from activities import host_news, wake_queue
from activities.host_estimate import HostPathActivities, request_from_host
from activities.hub_headers import HubUnreachable, header_copy
from activities.metrics import ControlMetrics
from activities.drain import wait_drained
from activities.batch import Batch
from activities.booking import BookingActivities
from activities.place_batch import MAX_PLACE_BATCH, PlaceAsk, place_many
from activities.record_batch import RecordBatch
from activities import tenancy
from store import db, ledger, records, serving, tenants
from store.snapshot_cache import SnapshotCache
from scheduler import scale_down
from scheduler.cluster import ClusterSnapshot
from scheduler.errors import GpuflowError
from scheduler.estimate import estimate_request, states_resources
from scheduler.limits import Limits
from scheduler.estimate_inputs import EstimateInputs
from scheduler.naming import name_problem
from scheduler.policy_config import PolicyConfig
from scheduler.request import Request
from scheduler.spec import ModelSpec, PlacementStrategy
from scheduler.summary import request_summary, summary_text
from contracts import activity_names as c
from contracts.search import SA_DEPLOYMENT, SA_MODEL, SA_STATE

TOP_CANDIDATES = 10
LIST_CHUNK = 100  # workflow ids in one visibility query (closed_workflows)
PLACE_TRIES = 3  # decisions the place activity makes while the ledger refuses its plans, before it fails and is retried


class EstimateCache:
    """Requests by spec and file mtime: a model is costed once, not once per decision."""

    def __init__(self, hub_cache: str | None = None, hf_endpoint: str | None = None,
                 timeout_s: float = Limits().estimate_timeout_s) -> None:
        self._d: dict[tuple, Request] = {}
        self._lock = threading.Lock()
        self.hub_cache, self.hf_endpoint, self.timeout_s = hub_cache, hf_endpoint, timeout_s

    def get(self, spec: ModelSpec, inputs: EstimateInputs | None = None,
            cancel: threading.Event | None = None) -> Request:
        """The request, from the cache or costed now. ``inputs``: a local path as a GPU host read it
        (host_estimate.py; the control plane then opens nothing, and the header was checked
        against its tensors there). Otherwise a child process costs it (killed after
        ``timeout_s`` or once ``cancel`` is set: see activities/estimate_process.py); a spec that
        gives its resources is not costed from files, so it is estimated here, at once."""
        path = spec.source.local_path
        try:
            stamp = inputs.stamp() if inputs is not None else os.stat(path).st_mtime_ns if path else None
        except OSError:
            stamp = None
        key = (spec.model_dump_json(), stamp)
        with self._lock:
            hit = self._d.get(key)
        if hit is not None:
            return hit
        override = None
        if path is None and not states_resources(spec) and self.hub_cache:
            override = header_copy(spec.source, self.hub_cache, self.hf_endpoint)  # a hub model: its headers
        if inputs is not None:
            req = request_from_host(spec, inputs)
        elif states_resources(spec):  # nothing to cost: no child needed
            req = estimate_request(spec, override)
        else:
            req = estimate_in_child(spec, override, self.timeout_s, cancel)
        with self._lock:
            if len(self._d) > 256:
                self._d.clear()
            self._d[key] = req
        return req

    def peek(self, spec: ModelSpec) -> Request | None:
        """The request last costed for ``spec`` (whatever file stamp it was costed at), or None;
        never costs anything (the wake queue's view: activities/wake_queue.py)."""
        want = spec.model_dump_json()
        with self._lock:
            return next((r for (k, _), r in reversed(self._d.items()) if k == want), None)


def _spec(raw: dict) -> ModelSpec:
    try:
        return ModelSpec.model_validate(raw)
    except ValueError as e:
        raise ApplicationError(f"invalid model spec: {e}", type="InvalidSpec", non_retryable=True) from None


def decision_record(d, req: Request, workers: int, gens: dict[str, int]) -> DecisionRecord:
    full = d.to_dict(d.top(TOP_CANDIDATES))  # the best by rounded score, ties in the policy's order
    full["candidates_total"] = len(d.candidates)
    plan = None
    if d.placement is not None:
        p = d.placement
        plan = PlacementPlan(worker=p.worker, gpu_indexes=list(p.gpu_indexes),
                             claim=p.claim.model_dump(exclude_none=True),
                             subordinates=[s.model_dump(exclude_none=True) for s in p.subordinates],
                             cpus=p.cpus, numa_nodes=p.numa_nodes)
    return DecisionRecord(scheduled=d.scheduled, plan=plan, strategy=d.strategy, score=d.score,
                          reasons=list(d.reasons), request=request_summary(req), decision=full, workers_seen=workers,
                          generations=gens)


from activities.rollout_probe import RolloutProbe  # noqa: E402  (the rollout's replica probe)


class ControlActivities:
    def __init__(self, engine: Engine, client: Client, policy: PolicyConfig | None = None, threads: int = 16,
                 metrics: ControlMetrics | None = None, hub_cache: str | None = None, hf_endpoint: str | None = None,
                 limits: Limits | None = None, pending_recheck_s: float = 600.0):
        self.engine, self.client = engine, client
        self.reads = db.reader(engine)  # read-only transactions: on SQLite, beside the writers (db.py)
        self.pending_recheck_s = pending_recheck_s
        self.limits = limits or Limits()
        self.metrics = metrics or ControlMetrics()
        self.policy = policy or PolicyConfig()
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="gpuflow-store")
        self.estimates = EstimateCache(hub_cache, hf_endpoint, self.limits.estimate_timeout_s)
        self.snapshots = SnapshotCache()  # refreshed incrementally by each decision
        self.rows = RecordBatch(lambda recs: asyncio.get_running_loop().run_in_executor(  # group commit
            self.pool, records.record_instances, self.engine, recs))
        self.deciding = threading.Lock()  # one decision at a time: each sees the placements handed out before it
        self.placing: Batch[PlaceAsk, PlaceResult | None] = Batch(lambda asks: asyncio.get_running_loop().run_in_executor(
            self.pool, place_many, self, asks), MAX_PLACE_BATCH)

    def all(self) -> list:
        return [self.save_deployment, self.record_instance, self.estimate_model, self.decide_placement,
                self.reserve_placement, self.release_placement, self.start_instances, self.rank_scale_down,
                self.closed_workflows, self.host_seen, self.host_lost, self.host_forget, self.drain_instance,
                self.deployment_limits, self.tenant_problem, self.preempt_placement, self.victims_left,
                self.sweep_queue, self.place_replica] + HostPathActivities(self.engine, self._db).all() + \
            RolloutProbe(self.client).all() + BookingActivities(self.reads, self.pool).all()

    async def _db(self, fn, *args, cancel: threading.Event | None = None):
        """Run blocking store/file work in the pool, heartbeating meanwhile: a control-plane
        worker that dies mid-call is noticed within the heartbeat timeout, not start-to-close.
        A cancelled activity sets ``cancel``, for work that can stop (an estimate)."""
        return await self._heartbeating(asyncio.get_running_loop().run_in_executor(self.pool, fn, *args), cancel)

    @staticmethod
    async def _heartbeating(fut: asyncio.Future, cancel: threading.Event | None = None):
        """``fut``'s result, heartbeating every second meanwhile (not in a local activity)."""
        while True:
            try:
                done, _ = await asyncio.wait({fut}, timeout=1.0)
            except asyncio.CancelledError:
                if cancel is not None:
                    cancel.set()
                raise
            if done:
                return fut.result()
            if not activity.info().is_local:  # a local activity has no heartbeat (the workflow's task waits on it)
                activity.heartbeat()

    async def wake_pending(self) -> int:
        """Wake the heads of the PENDING queue that now fit, in queue order (activities/wake_queue.py)."""
        return await wake_queue.wake(self)

    @activity.defn(name=c.SWEEP_QUEUE)
    async def sweep_queue(self) -> float:
        """The periodic sweep of the PENDING queue (workflows/queue_sweep.py); returns how long
        to wait before the next, this worker's ``pending_recheck_s``."""
        await wake_queue.wake(self, sweep=True)
        return self.pending_recheck_s

    @activity.defn(name=c.SAVE_DEPLOYMENT)
    async def save_deployment(self, name: str, spec: dict, replicas: int, state: str) -> None:
        await self._db(records.save_deployment, self.engine, name, spec, replicas, state)

    @activity.defn(name=c.RECORD_INSTANCE)
    async def record_instance(self, rec: InstanceRecord) -> None:
        await self._heartbeating(self.rows.record(rec))

    @activity.defn(name=c.ESTIMATE_MODEL)
    async def estimate_model(self, raw: dict, inputs: EstimateInputs | None = None) -> EstimateRecord:
        spec = _spec(raw)
        cancel = threading.Event()  # set when the activity is cancelled: the estimate's process is killed
        try:
            req = await self._db(self.estimates.get, spec, inputs, cancel, cancel=cancel)
        except HubUnreachable as e:
            raise ApplicationError(str(e), type="HubUnreachable") from None
        except GpuflowError as e:
            raise ApplicationError(str(e), type="ModelError", non_retryable=True) from None
        s = request_summary(req)
        return EstimateRecord(model=spec.name, request=s, summary=summary_text(s))

    @activity.defn(name=c.DECIDE_PLACEMENT)
    async def decide_placement(self, instance: str, raw: dict, inputs: EstimateInputs | None = None) -> DecisionRecord:
        spec = _spec(raw)

        try:
            return await self._db(self._decide, instance, spec, inputs)
        except GpuflowError as e:
            raise ApplicationError(str(e), type="ModelError", non_retryable=True) from None

    def _decide(self, instance: str, spec: ModelSpec, inputs: EstimateInputs | None = None) -> DecisionRecord:
        rec = self.decide_many([(instance, spec, self.estimates.get(spec, inputs))])[0]
        if isinstance(rec, GpuflowError):
            raise rec
        return rec

    def decide_many(self, asks: list[tuple[str, ModelSpec, Request]]) -> list[DecisionRecord | GpuflowError]:
        """The placement of each (instance, spec, request), in order, with the tenant's verdict
        (activities/tenancy.py): over a limit it is not placed, the quota named first; a replica
        that does not fit may be placed by preemption, its victims in the record. Decisions in this
        process run one at a time, and a placement handed out is assumed taken by the next until
        the store shows it booked (SnapshotCache.assume). The store is read once, before the lock
        (the snapshot's changes, the owners of each model): inside it there is no I/O, only the
        policy, while the other decisions wait. gpuflow_decision_seconds observes each decision's
        policy time plus its share of those reads. A spec the policy refuses (GpuflowError) gets
        its error in its place; the others are decided."""
        started = time.perf_counter()
        who = {}
        for _, spec, _ in asks:
            if spec.name not in who:
                who[spec.name] = tenancy.owners_of(self.reads, spec)
        self.snapshots.sync(self.reads)
        share = (time.perf_counter() - started) / len(asks)
        recs: list[DecisionRecord | GpuflowError] = []
        mine: set[str] = set()  # placed by this batch: booked with it, not only assumed
        grouped: dict[str, DecisionRecord] = {}  # decided with an earlier replica of its deployment that preempts
        with self.deciding:
            for k, (instance, spec, req) in enumerate(asks):
                t = time.perf_counter()
                try:
                    rec = grouped.pop(instance) if instance in grouped else \
                        self._decide_locked(instance, spec, req, who[spec.name], mine)
                    rest = [n for n, s2, r2 in asks[k + 1:] if n not in grouped and s2 == spec and r2 == req] \
                        if rec.victims else []
                    if rest:  # the replicas of its deployment in this batch preempt together (tenancy/group.py)
                        rec, more = self._decide_group_locked([instance, *rest], spec, req, who[spec.name])
                        grouped.update(more)
                except GpuflowError as e:
                    recs.append(e)
                    continue
                self.metrics.decision_seconds.observe(share + time.perf_counter() - t)
                self.metrics.decisions.labels("over_quota" if rec.decision.get("quota") else "preempting" if rec.victims
                                              else "scheduled" if rec.scheduled else "unschedulable").inc()
                if rec.places_outright:
                    mine.add(instance)
                recs.append(rec)
        return recs

    def _decide_locked(self, instance: str, spec: ModelSpec, req: Request, who, mine: set[str]) -> DecisionRecord:
        """On the snapshot with every placement assumed; when that does not place the replica, on
        the store's with only ``mine`` assumed (the batch's own, booked in its transaction): the
        others may yet fail to book."""
        def on(snap: ClusterSnapshot, gens: dict[str, int]) -> DecisionRecord:
            adm, owners = tenancy.decide_with_tenants(self.engine, snap, spec, req, instance, self.policy, who)
            return tenancy.amend(decision_record(adm.decision, req, len(snap.workers), gens), adm, owners, snap, spec)

        snap, base, gens = self.snapshots.current()
        rec = on(snap, gens)
        if not rec.places_outright and base is not None and not set(self.snapshots.assumed()) <= mine:
            rec = on(self.snapshots.current(only=mine)[0], gens)  # what is only assumed may fail (preemptions stay)
        self._assume(instance, spec, rec)
        return rec

    def _assume(self, instance: str, spec: ModelSpec, rec: DecisionRecord) -> None:
        """A placement handed out (a preemption with its victims) is assumed taken by the next decisions."""
        if rec.places_outright or rec.victims and rec.plan is not None:
            self.snapshots.assume(instance, spec.name, rec.plan, [v.name for v in rec.victims])
        else:
            self.snapshots.forget(instance)

    def _decide_group_locked(self, names: list[str], spec: ModelSpec, req: Request,
                             who) -> tuple[DecisionRecord, dict[str, DecisionRecord]]:
        """``names`` (replicas of one deployment, the first preempting) decided together; the
        first's record, and the others' by name."""
        for n in names:
            self.snapshots.forget(n)
        snap, _, gens = self.snapshots.current()
        adms, owners = tenancy.decide_group(self.engine, snap, spec, req, names, self.policy, who)
        recs = [tenancy.amend(decision_record(a.decision, req, len(snap.workers), gens), a, owners, snap, spec)
                for a in adms]
        for n, r in zip(names, recs):
            self._assume(n, spec, r)
        return recs[0], dict(zip(names[1:], recs[1:]))

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
        spec = _spec(raw)
        if isinstance(inputs, dict):  # fewer arguments than parameters: the SDK decodes without type hints
            inputs = EstimateInputs.model_validate(inputs)
        if then not in ("scheduled", "starting"):
            raise ApplicationError(f"a booking records SCHEDULED or STARTING, not {then!r}", type="InvalidInput",
                                   non_retryable=True)
        try:  # costed before it joins a batch (cached: the estimate activity costed a spec read from files)
            req = await self._db(self.estimates.get, spec, inputs)
        except GpuflowError as e:
            raise ApplicationError(str(e), type="ModelError", non_retryable=True) from None
        for _ in range(PLACE_TRIES):
            fut = self.placing.submit(PlaceAsk(instance, spec, req, then))
            try:
                got = await self._heartbeating(fut)
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
        _spec(raw)  # a spec that does not validate books nothing
        if isinstance(d, dict):  # called without ``inputs``: the SDK then decodes without type hints
            d = DecisionRecord.model_validate(d)
        if d.plan is None:
            raise ApplicationError("a booking needs a plan", type="InvalidInput", non_retryable=True)
        try:
            plan, now = await self._db(ledger.reserve, self.engine, instance, d.plan)
        except ledger.StaleDecision as e:
            self.snapshots.forget(instance)  # the promise failed: nobody here waits on it
            self.metrics.conflicts.labels("rejected").inc()
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
            plan, now = await self._db(ledger.preempt, self.engine, instance, d.plan,
                                       {v.name: v.plan for v in d.victims}, why)
        except ledger.StaleDecision as e:
            self.snapshots.forget(instance)  # its victims are no longer assumed gone
            self.metrics.conflicts.labels("rejected").inc()
            raise ApplicationError(str(e), type="StaleDecision", non_retryable=True) from None
        if now:
            for v in d.victims:
                self.metrics.preemptions.labels(d.tenant, v.tenant).inc()
        return ReserveResult(plan=plan, booked_now=now)

    @activity.defn(name=c.VICTIMS_LEFT)
    async def victims_left(self, names: list[str]) -> list[str]:
        """Which of these preempted instances may still run a process (records.preempted_running)."""
        return await self._db(records.preempted_running, self.engine, names)

    @activity.defn(name=c.RELEASE_PLACEMENT)
    async def release_placement(self, instance: str) -> int:
        n = await self._db(ledger.release, self.engine, instance)
        if n or activity.info().attempt > 1:  # a retry finds nothing left to release, but the first try's wake may be lost
            await self.wake_pending()
        return n

    @activity.defn(name=c.START_INSTANCES)
    async def start_instances(self, inputs: list[InstanceInput]) -> None:
        """The first rows of a batch of replicas in one transaction, then their workflows started
        together, by this code's generation (InstanceInput.code) and with their search attributes
        set (the workflow then upserts none of its own until it is placed). A retry is harmless:
        rows already written are kept, and a workflow already running is used as it is
        (USE_EXISTING)."""
        await self._db(records.create_instances, self.engine, [InstanceRecord(
            name=inp.name, deployment=inp.deployment, model=str(inp.spec.get("name", "")), state="pending")
            for inp in inputs])
        activity.heartbeat()
        await asyncio.gather(*(self.client.start_workflow(
            "ModelInstanceWorkflow", inp.model_copy(update={"code": INSTANCE_CODE}), id=f"instance/{inp.name}",
            task_queue=CONTROL_QUEUE, id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            search_attributes=TypedSearchAttributes([
                SearchAttributePair(SA_MODEL, str(inp.spec.get("name", ""))),
                SearchAttributePair(SA_DEPLOYMENT, inp.deployment), SearchAttributePair(SA_STATE, "PENDING")]),
            static_summary=f"replica {inp.name} of {inp.deployment}") for inp in inputs))

    @activity.defn(name=c.RANK_SCALE_DOWN)
    async def rank_scale_down(self, model: str, strategy: str, live: list[str]) -> ScaleDownOrder:
        def run() -> ScaleDownOrder:
            snap = self.snapshots.refresh(self.engine)[0]
            ranked = scale_down.rank(snap, model, PlacementStrategy(strategy), self.policy)
            order = [r.instance.name for r in ranked if r.instance.name in live]
            missing = [n for n in live if n not in order]  # not in the store yet: nothing placed, remove first
            return ScaleDownOrder(order=missing + order, ranking=[r.to_dict() for r in ranked if r.instance.name in live])

        return await self._db(run)

    async def _listed_running(self, names: list[str]) -> set[str]:
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
                async for w in self.client.list_workflows(q):
                    found.add(w.id.removeprefix("instance/"))
            except RPCError:  # visibility unavailable: every name is described, as before
                return set()
            if activity.in_activity():
                activity.heartbeat()
        return found

    @activity.defn(name=c.CLOSED_WORKFLOWS)
    async def closed_workflows(self, names: list[str]) -> list[ClosedInstance]:
        """Which of these instances' workflows are not running. One that ended without its own
        teardown (terminated from the UI, say) has its reservation released here and is
        recorded deleted; the caller stops its process on the host."""
        closed: list[ClosedInstance] = []
        released = 0
        running = await self._listed_running(names)
        for n in names:
            if n in running:
                continue
            activity.heartbeat()
            try:
                d = await self.client.get_workflow_handle(f"instance/{n}").describe()
                status = d.status.name if d.status is not None else "UNKNOWN"
            except RPCError as e:
                if e.status != RPCStatusCode.NOT_FOUND:
                    raise  # Temporal did not answer: retried, never read as an ended workflow
                status = "NOT_FOUND"
            if status == "RUNNING":
                continue
            held = await self._db(ledger.workers_of, self.engine, n)
            worker = await self._db(records.mark_gone, self.engine, n, f"its workflow ended: {status}")
            released += await self._db(ledger.release, self.engine, n)
            hosts = ([worker] if worker else []) + [w for w in held if w != worker]
            closed.append(ClosedInstance(name=n, status=status, worker=worker, hosts=hosts))
        if released or (closed and activity.info().attempt > 1):
            await self.wake_pending()
        return closed

    @activity.defn(name=c.HOST_SEEN)
    async def host_seen(self, report: HostReport) -> None:
        """The host's report (a hello, or its inventory changed): recorded READY. A hello from a new
        agent run (HostReport.boot) tells the instances placed there to supervise afresh."""
        changed, restarted = await self._db(records.see_worker, self.engine, report, "ready")
        if restarted or activity.info().attempt > 1:
            await self._tell_instances_on(report.name, "restarted", "its agent restarted")
        if changed or activity.info().attempt > 1:  # as release_placement: a retry may follow a lost wake
            await self.wake_pending()

    @activity.defn(name=c.DEPLOYMENT_LIMITS)
    async def deployment_limits(self) -> Limits:
        """The operator's limits (this server's settings), for a deployment to check against."""
        return self.limits

    @activity.defn(name=c.TENANT_PROBLEM)
    async def tenant_problem(self, tenant: str | None) -> str | None:
        """Why a spec naming ``tenant`` is refused (not in the tenants file), else None."""
        return await self._db(tenants.problem, self.engine, tenant)

    @activity.defn(name=c.HOST_LOST)
    async def host_lost(self, name: str, reason: str) -> None:
        """The host's watch failed: NOT_READY, and the instances placed there hear it at once."""
        await self._db(records.set_worker_state, self.engine, name, "not_ready", reason)
        await self._tell_instances_on(name, "lost", reason.removeprefix("agent stopped answering: ")[:500])

    async def _tell_instances_on(self, host: str, kind: str, why: str) -> None:
        """The instances holding ledger lines on ``host`` hear what its watch learned (host_news.py)."""
        await host_news.tell(self.client, await self._db(ledger.instances_on, self.reads, host),
                             HostNews(host=host, kind=kind, why=why))

    @activity.defn(name=c.HOST_FORGET)
    async def host_forget(self, name: str) -> str | None:
        """An operator forgets a host that is gone for good: its row leaves the store, or the reason
        it may not yet (records.forget_worker)."""
        return await self._db(records.forget_worker, self.engine, name)

    @activity.defn(name=c.DRAIN_INSTANCE)
    async def drain_instance(self, instance: str, timeout_s: float) -> int:
        """Wait until the live gateways have no request in flight on ``instance`` (already out of
        the routing table), at most ``timeout_s``; returns the requests left (activities/drain.py)."""
        def ask(fn, *args):
            return asyncio.get_running_loop().run_in_executor(self.pool, fn, self.engine, *args)

        async def gateways() -> int:
            return len(await ask(serving.live_gateways))

        return await wait_drained(lambda: ask(serving.in_flight, instance), gateways,
                                  lambda n: activity.heartbeat({"in_flight": n}), timeout_s)
