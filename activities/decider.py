"""Placement decisions on a control-plane worker: the policy on the cached snapshot, with each
tenant's verdict, one decision at a time.

``Decider`` is shared by every call that decides (the place activity's batches:
activities/placement.py, activities/place_batch.py), so its lock keeps them in one line: each decision sees the placements handed out before it (SnapshotCache.assume),
whichever path made them. The policy itself is ``run_policy`` (contracts/decision_of.py over
scheduler/decision_inputs.py), on the inputs kept
for each decision (``keeper``: activities/decision_keeper.py), so that it can be re-run later."""

from __future__ import annotations

import threading
import time

from sqlalchemy.engine import Engine

from activities import tenancy
from activities.decision_keeper import DecisionKeeper
from activities.metrics import ControlMetrics
from activities.queue_gate import QueueGate, held
from contracts.control import ScaleDownOrder
from contracts.decision import DecisionRecord
from contracts.decision_of import run_policy
from scheduler import scale_down
from scheduler.cluster import ClusterSnapshot
from scheduler.decision_inputs import DecisionInputs
from scheduler.errors import GpuflowError
from scheduler.policy_config import PolicyConfig
from scheduler.request import Request
from scheduler.spec import ModelSpec, PlacementStrategy
from store.pending_queue import Queue
from store.snapshot_cache import SnapshotCache


class Decider:
    def __init__(self, engine: Engine, reads: Engine, snapshots: SnapshotCache, policy: PolicyConfig,
                 metrics: ControlMetrics, keeper: DecisionKeeper | None = None):
        """``reads``: the read-only engine (db.reader) for what a batch reads before the lock;
        ``keeper``: where each decision's inputs are kept (None: not kept)."""
        self.engine, self.reads, self.snapshots, self.policy, self.metrics = engine, reads, snapshots, policy, metrics
        self.keeper = keeper
        self.gate: QueueGate | None = None  # the queue's order at the decision (activities/queue_gate.py; None: no gate)
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
        queue, again = self.gate.read([a[0] for a in asks]) if self.gate is not None else (None, set())
        share = (time.perf_counter() - started) / len(asks)
        recs: list[DecisionRecord | GpuflowError] = []
        mine: set[str] = set()  # placed by this batch: booked with it, not only assumed
        grouped: dict[str, DecisionRecord] = {}  # decided with an earlier replica of its deployment that preempts
        kept: dict[str, tuple[DecisionInputs, list[DecisionRecord]]] = {}  # the inputs of each record returned
        with self.deciding:
            for k, (instance, spec, req) in enumerate(asks):
                t = time.perf_counter()
                try:
                    if instance in grouped:
                        rec = grouped.pop(instance)
                    else:
                        rec, inp = self._decide_locked(instance, spec, req, who[spec.name], mine,
                                                       queue if instance in again else None)
                        if not rec.held:  # a held record keeps no inputs (queue_gate.held)
                            kept[instance] = (inp, [rec])
                    rest = [n for n, s2, r2 in asks[k + 1:] if n not in grouped and s2 == spec and r2 == req] \
                        if rec.victims else []
                    if rest:  # the replicas of its deployment in this batch preempt together (tenancy/group.py)
                        inp, group = self._decide_group_locked([instance, *rest], spec, req, who[spec.name])
                        rec, more = group[0], dict(zip(inp.names[1:], group[1:]))
                        kept[instance] = (inp, group)
                        grouped.update(more)
                except GpuflowError as e:
                    recs.append(e)
                    continue
                self.metrics.decision_seconds.observe(share + time.perf_counter() - t)
                self.metrics.decisions.labels("over_quota" if rec.quota else "preempting" if rec.victims
                                              else "scheduled" if rec.scheduled else "held_back" if rec.held
                                              else "unschedulable").inc()
                if rec.places_outright:
                    mine.add(instance)
                recs.append(rec)
        if self.keeper is not None:  # outside the lock: the inputs are immutable views
            for inp, group in kept.values():
                self.keeper.keep(inp, group)
        return recs

    def _decide_locked(self, instance: str, spec: ModelSpec, req: Request, who, mine: set[str],
                       queue: Queue | None = None) -> tuple[DecisionRecord, DecisionInputs]:
        """On the snapshot with every placement assumed; when that does not place the replica, on
        the store's with only ``mine`` assumed (the batch's own, booked in its transaction): the
        others may yet fail to book. The record, and the inputs it was decided on. ``queue``: the
        PENDING queue, for a replica woken to decide again: placed outright, it is held instead
        when a replica ahead of it takes that capacity (activities/queue_gate.py)."""
        tf, owners = who

        def on(snap: ClusterSnapshot, gens: dict[str, int]) -> tuple[DecisionRecord, DecisionInputs]:
            inp = DecisionInputs(snap, spec, req, tf, owners, [instance], self.policy, gens)
            return run_policy(inp)[0], inp

        snap, base, gens = self.snapshots.current()
        rec, inp = on(snap, gens)
        if not rec.places_outright and base is not None and not set(self.snapshots.assumed()) <= mine:
            rec, inp = on(self.snapshots.current(only=mine)[0], gens)  # what is only assumed may fail (preemptions stay)
        if queue is not None and rec.places_outright and self.gate is not None:
            ahead = self.gate.ahead(queue, inp.snapshot, instance, spec, req, self.policy, set(self.snapshots.assumed()))
            if ahead is not None:
                rec = held(rec, ahead)
        self._assume(instance, spec, rec)
        return rec, inp

    def _assume(self, instance: str, spec: ModelSpec, rec: DecisionRecord) -> None:
        """A placement handed out (a preemption with its victims) is assumed taken by the next decisions."""
        if rec.places_outright or rec.victims and rec.plan is not None:
            self.snapshots.assume(instance, spec.name, rec.plan, [v.name for v in rec.victims])
        else:
            self.snapshots.forget(instance)

    def _decide_group_locked(self, names: list[str], spec: ModelSpec, req: Request,
                             who) -> tuple[DecisionInputs, list[DecisionRecord]]:
        """``names`` (replicas of one deployment, the first preempting) decided together; the
        inputs, and the records in the order of ``names``."""
        for n in names:
            self.snapshots.forget(n)
        snap, _, gens = self.snapshots.current()
        inp = DecisionInputs(snap, spec, req, who[0], who[1], list(names), self.policy, gens)
        recs = run_policy(inp)
        for n, r in zip(names, recs):
            self._assume(n, spec, r)
        return inp, recs
