"""Placement decisions on a control-plane worker: the policy on the cached snapshot, with each
tenant's verdict, one decision at a time.

``Decider`` is shared by every call that decides (the place activity's batches:
activities/placement.py, activities/place_batch.py), so its lock keeps them in one line: each decision sees the placements handed out before it (SnapshotCache.assume),
whichever path made them. ``decision_record`` is the record a decision leaves in the workflow's
history (contracts/decision.py; the store keeps its short summary)."""

from __future__ import annotations

import threading
import time

from sqlalchemy.engine import Engine

from activities import tenancy
from activities.metrics import ControlMetrics
from contracts.control import ScaleDownOrder
from contracts.decision import CandidateView, DecisionRecord, FilterView, PlacementPlan, RequestSummary
from scheduler import scale_down
from scheduler.cluster import ClusterSnapshot
from scheduler.errors import GpuflowError
from scheduler.policy_config import PolicyConfig
from scheduler.request import Request
from scheduler.spec import ModelSpec, PlacementStrategy
from scheduler.summary import request_summary
from store.snapshot_cache import SnapshotCache

TOP_CANDIDATES = 10


def decision_record(d, req: Request, workers: int, gens: dict[str, int]) -> DecisionRecord:
    """The policy's Decision as the record keeps it: each part typed (contracts/decision.py), the
    best TOP_CANDIDATES candidates listed (by rounded score, ties in the policy's order)."""
    plan = None
    if d.placement is not None:
        p = d.placement
        plan = PlacementPlan(worker=p.worker, gpu_indexes=list(p.gpu_indexes),
                             claim=p.claim.model_dump(exclude_none=True),
                             subordinates=[s.model_dump(exclude_none=True) for s in p.subordinates],
                             cpus=p.cpus, numa_nodes=p.numa_nodes)
    return DecisionRecord(
        scheduled=d.scheduled, plan=plan, strategy=d.strategy, score=d.score, reasons=list(d.reasons),
        request=RequestSummary.model_validate(request_summary(req)),
        placement=CandidateView.model_validate(d.placement.to_dict(with_scores=False)) if d.placement else None,
        candidates=[CandidateView.model_validate(c.to_dict()) for c in d.top(TOP_CANDIDATES)],
        candidates_total=len(d.candidates), filters=[FilterView.model_validate(f.to_dict()) for f in d.filters],
        decisive=d.decisive, workers_seen=workers, generations=gens)


class Decider:
    def __init__(self, engine: Engine, reads: Engine, snapshots: SnapshotCache, policy: PolicyConfig,
                 metrics: ControlMetrics):
        """``reads``: the read-only engine (db.reader) for what a batch reads before the lock."""
        self.engine, self.reads, self.snapshots, self.policy, self.metrics = engine, reads, snapshots, policy, metrics
        self.deciding = threading.Lock()  # one decision at a time: each sees the placements handed out before it

    def decide(self, instance: str, spec: ModelSpec, req: Request) -> DecisionRecord:
        """One replica's decision; the policy's GpuflowError raised."""
        rec = self.decide_many([(instance, spec, req)])[0]
        if isinstance(rec, GpuflowError):
            raise rec
        return rec

    def refused(self, instance: str) -> None:
        """The ledger refused ``instance``'s plan (the capacity moved since the snapshot): its
        placement (and its victims, for a preemption) is no longer assumed, and the conflict counted."""
        self.snapshots.forget(instance)  # the promise failed: nobody here waits on it
        self.metrics.conflicts.labels("rejected").inc()

    def scale_down_order(self, model: str, strategy: str, live: list[str]) -> ScaleDownOrder:
        """``live`` (replicas of ``model``) in the order to remove them, on the refreshed snapshot
        (scheduler/scale_down.py); no decision lock: it hands out nothing."""
        snap = self.snapshots.refresh(self.engine)[0]
        ranked = scale_down.rank(snap, model, PlacementStrategy(strategy), self.policy)
        order = [r.instance.name for r in ranked if r.instance.name in live]
        missing = [n for n in live if n not in order]  # not in the store yet: nothing placed, remove first
        return ScaleDownOrder(order=missing + order, ranking=[r.to_dict() for r in ranked if r.instance.name in live])

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
                self.metrics.decisions.labels("over_quota" if rec.quota else "preempting" if rec.victims
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
