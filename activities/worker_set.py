"""Every activity a control-plane worker registers on ``gpuflow-control``, built in one place from
its settings (``gpuflow server``: gpuflow/server.py), with the shared pieces each class is handed:

| shared | what | who takes it |
| --- | --- | --- |
| ``Runner`` | the thread pool for blocking work, heartbeating while it runs | every class that blocks |
| ``EstimateCache`` | requests costed on this worker | placement, the wake, the autoscaler |
| ``SnapshotCache`` | the cluster snapshot, refreshed incrementally | the Decider, the wake |
| ``Decider`` | the policy with tenancy; its lock: one decision at a time | placement (and its batches) |
| ``Waker`` | the PENDING queue's wake, one at a time | placement, records, hosts, queue, cluster |
| ``ControlMetrics`` | the control plane's Prometheus registry | placement, host_auth, autoscale |
| ``RecordBatch`` | the instance rows' group commit | records |
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.engine import Engine
from temporalio.client import Client

from activities.autoscale import AutoscaleActivities
from activities.booking import BookingActivities
from activities.cluster import ClusterActivities
from activities.cluster_reads import StoreReads
from activities.decider import Decider
from activities.decision_keeper import DecisionKeeper
from activities.drain import DrainActivities
from activities.estimate_cache import EstimateCache
from activities.claims_read import ClaimsReader
from activities.host_auth import HostAuthActivities
from activities.group_activities import GroupActivities
from activities.hosts import HostStateActivities
from scheduler.claims.settings import ClaimSettings
from activities.metrics import ControlMetrics
from activities.pd_health import PDHealthActivities
from activities.place_batch import place_batches
from activities.placement import PlacementActivities
from activities.queue import QueueActivities
from activities.record_batch import RecordBatch
from activities.records import RecordActivities
from activities.rollout_probe import RolloutProbe
from activities.runner import Runner
from activities.queue_gate import QueueGate
from activities.wake_queue import Waker, known_request
from contracts.limits import Limits
from scheduler.policy_config import PolicyConfig
from store import db, records as store_records
from store.snapshot_cache import SnapshotCache


@dataclass
class WorkerSet:
    """One worker's activity classes, and the shared pieces they were built with."""

    runner: Runner
    metrics: ControlMetrics
    estimates: EstimateCache
    snapshots: SnapshotCache
    decider: Decider
    waker: Waker
    placement: PlacementActivities
    groups: GroupActivities  # a prefill/decode group's formation, added members, scale-in (issue 41)
    records: RecordActivities
    hosts: HostStateActivities
    host_auth: HostAuthActivities  # the check of every host report (a local activity of the host workflow)
    drain: DrainActivities
    queue: QueueActivities
    booking: BookingActivities
    rollout: RolloutProbe
    autoscale: AutoscaleActivities
    pd_health: PDHealthActivities  # a prefill/decode group's pd_ineffective check (issue 35)
    cluster: ClusterActivities  # the cluster workflow's (workflows/cluster.py)
    cluster_reads: StoreReads  # the reads workflow's queries, answered from the store (workflows/cluster_reads.py)

    def all(self) -> list:
        """Every activity, for the worker's ``activities=``."""
        return [fn for group in (self.placement, self.groups, self.records, self.hosts, self.host_auth, self.drain, self.queue,
                                 self.booking, self.rollout, self.autoscale, self.pd_health, self.cluster) for fn in group.all()]


def control_activities(engine: Engine, client: Client, policy: PolicyConfig | None = None, threads: int = 16,
                       metrics: ControlMetrics | None = None, hub_cache: str | None = None,
                       hf_endpoint: str | None = None, limits: Limits | None = None,
                       pending_recheck_s: float = 600.0, capacity_hook: str | None = None,
                       keep_days: float = 30.0, claims: ClaimSettings | None = None) -> WorkerSet:
    """The activities of one control-plane worker. ``threads``: the blocking pool's size;
    ``hub_cache``/``hf_endpoint``: where hub headers are read for an estimate;
    ``pending_recheck_s``: the PENDING queue's sweep period; ``capacity_hook``: the command the
    autoscaler calls with unmet demand; ``keep_days``: how long decisions' inputs are kept (0: none);
    ``claims``: the learned claims' settings (GPUFLOW_CLAIMS__*)."""
    reads = db.reader(engine)  # read-only transactions: on SQLite, beside the writers (store/db.py)
    limits = limits or Limits()
    metrics = metrics or ControlMetrics()
    policy = policy or PolicyConfig()
    runner = Runner(threads)
    estimates = EstimateCache(hub_cache, hf_endpoint, limits.estimate_timeout_s)
    snapshots = SnapshotCache()  # refreshed incrementally by each decision
    decider = Decider(engine, reads, snapshots, policy, metrics, DecisionKeeper(engine, keep_days, metrics=metrics) if keep_days else None)
    waker = Waker(engine, client, snapshots, estimates, policy, runner.run)
    waker.claims = ClaimsReader(engine, reads, claims)  # learned claims: the placements and the PENDING queue's wake
    decider.gate = QueueGate(reads, waker.request)  # the queue's order kept at the decision too
    rows = RecordBatch(lambda recs: runner.submit(store_records.record_instances, engine, recs))  # group commit
    host_auth = HostAuthActivities(engine, reads, runner, metrics.registry)
    return WorkerSet(
        runner=runner, metrics=metrics, estimates=estimates, snapshots=snapshots, decider=decider, waker=waker,
        placement=PlacementActivities(engine, runner, estimates, decider, place_batches(decider, engine, runner),
                                      metrics, waker.wake, waker.claims),
        groups=GroupActivities(engine, runner, estimates, decider, waker.wake),
        records=RecordActivities(engine, client, runner, rows, waker.wake),
        hosts=HostStateActivities(engine, reads, client, runner, waker.wake, host_auth, claims),
        host_auth=host_auth,
        drain=DrainActivities(engine, runner),
        queue=QueueActivities(engine, runner, waker.wake, limits, pending_recheck_s),
        booking=BookingActivities(reads, runner),
        rollout=RolloutProbe(client, engine),
        autoscale=AutoscaleActivities(engine, client, runner, estimates, policy, metrics.registry, capacity_hook,
                                      decider.keeper),
        pd_health=PDHealthActivities(engine, runner),
        cluster=ClusterActivities(engine, runner, estimates, policy, waker.wake),
        cluster_reads=StoreReads(engine, reads, runner.pool, lambda spec: known_request(estimates, spec), policy,
                                 limits, claims=claims))
