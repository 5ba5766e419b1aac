"""The cluster snapshot kept in memory by a control-plane worker and refreshed incrementally.

A refresh reads, in one session and in this order: every worker's generation (one narrow query),
the change counter, the instances logged since the last refresh, and only the worker and
instance rows that changed. The cache can make a decision stale, never an overbooking: the
ledger's check at reserve time reads the store, not the cache, and a plan that no longer fits
is decided again.

Assumed placements (the kube-scheduler's "assume"): a placement this process has just decided
is laid over the snapshot as taken until the store shows a change to its instance made after the
decision (its booking, or anything else) or ``ASSUME_TTL_S`` passes. Replicas decided one after
another here then do not pick the same capacity, which the ledger would refuse for all but one.
An assumption is a promise that may fail (its booking refused), so a replica that does not fit
beside the assumed placements is decided again on the store's snapshot alone: it never waits
PENDING, or takes a quota reason, for capacity that is only promised (``views``).

A preemption decided here is assumed too, with its victims: the preemptor laid over the snapshot,
its victims gone from it, so the next replica decided here takes other victims, not the same ones
(which the ledger would refuse for all but one). Victims are as good as taken once chosen, so a
preemption is laid over every view, ``only`` or not.

No lock is held during database I/O (one thread's refresh may wait for the database while
another's runs): a refresh starts from the state it finds, builds a new one, and installs it
when it is the newest.
"""

from __future__ import annotations

import gc
import threading
import time
from dataclasses import dataclass, field

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from contracts.control import PlacementPlan
from store import changes
from store.snapshot import DRAINING, LIVE, instance_model, session, valid_workers
from store.tables import InstanceRow, ModelFileRow, WorkerRow
from scheduler import occupancy
from scheduler.cluster import ClusterSnapshot, Instance, ModelFile, Worker
from scheduler.occupancy import Occupancy

SHOWN = (*LIVE, DRAINING)  # the instances load_snapshot shows
ASSUME_TTL_S = 30.0  # a placement decided here and never booked stops being assumed after this


@dataclass
class _State:
    seq: int = -1  # change number read; -1: nothing loaded yet
    gens: dict[str, int] = field(default_factory=dict)
    workers: dict[str, Worker] = field(default_factory=dict)
    instances: dict[str, Instance] = field(default_factory=dict)
    files: list[ModelFile] = field(default_factory=list)
    snapshot: ClusterSnapshot = field(default_factory=ClusterSnapshot)
    occupancy: Occupancy = occupancy.EMPTY  # the snapshot's sums, derived from the previous ones
    changed: frozenset[str] | None = None  # instances changed since the state it was derived from; None: reloaded whole
    keys: dict[str, tuple] = field(default_factory=dict)  # worker -> its row's content key when loaded (row_key)


@dataclass(frozen=True)
class _Assumed:
    instance: Instance
    seq: int  # the change number of the snapshot it was decided on
    until: float  # monotonic deadline
    victims: tuple[str, ...] = ()  # a preemption's: gone from the views while it is assumed


@dataclass
class RefreshStats:
    full: int = 0  # whole reloads (first use, or the change log no longer reaching back)
    workers: int = 0  # worker rows reloaded
    instances: int = 0  # instance rows reloaded


class SnapshotCache:
    def __init__(self) -> None:
        self._state = _State()
        self._lock = threading.Lock()
        self._assumed: dict[str, _Assumed] = {}
        self.stats = RefreshStats()

    def refresh(self, bind: Engine | Session) -> tuple[ClusterSnapshot, dict[str, int]]:
        """The snapshot as of now (with the placements assumed here laid over it) and the worker
        generations it reflects at least."""
        snap, _, gens = self.views(bind)
        return snap, gens

    def views(self, bind: Engine | Session) -> tuple[ClusterSnapshot, ClusterSnapshot | None, dict[str, int]]:
        """(the snapshot with the assumed placements laid over it, the store's snapshot alone when
        any are assumed (else None), the worker generations)."""
        self.sync(bind)
        return self.current()

    def sync(self, bind: Engine | Session) -> None:
        """Read what changed in the store since the newest state here (the only I/O)."""
        with self._lock:
            old = self._state
        with session(bind) as s:
            gens = {n: g for n, g in s.exec(select(WorkerRow.name, WorkerRow.generation))}
            seq = changes.current(s)
            new = self._delta(s, old, gens, seq)
        with self._lock:
            if new.seq >= self._state.seq:
                self._state = new
            self._settle(new)

    def current(self, only: set[str] | None = None) -> tuple[ClusterSnapshot, ClusterSnapshot | None, dict[str, int]]:
        """``views`` of the newest state read, without reading the store: a decision syncs first,
        outside its lock, then takes this inside it (no I/O while the other decisions wait).
        ``only``: lay only these instances' assumed placements over it."""
        now = time.monotonic()
        with self._lock:
            state = self._state
            laid = [a for a in self._assumed.values()
                    if a.until > now and (only is None or a.instance.name in only or a.victims)]
        if not laid:
            return state.snapshot, None, state.gens
        return (_overlay(state, [a.instance for a in laid], {v for a in laid for v in a.victims}),
                state.snapshot, state.gens)

    def assume(self, instance: str, model: str, plan: PlacementPlan, victims: list[str] | None = None,
               role: str | None = None, group: str | None = None) -> None:
        """Lay ``plan`` over later snapshots as held by ``instance`` until the store shows it
        booked (or anything else of the instance changing), or ASSUME_TTL_S passes; ``victims``
        (a preemption's) are gone from them meanwhile. ``role``/``group``: a group member's."""
        inst = Instance(name=instance, model=model, state="scheduled", worker=plan.worker,
                        gpu_indexes=list(plan.gpu_indexes), claim=plan.claim.model_dump(),
                        subordinates=[x.model_dump() for x in plan.subordinates], role=role, group=group)
        with self._lock:
            self._assumed[instance] = _Assumed(inst, self._state.seq, time.monotonic() + ASSUME_TTL_S,
                                               tuple(victims or ()))

    def forget(self, instance: str) -> None:
        """Its placement is no longer assumed (its booking failed, or it decided again and was
        not placed)."""
        with self._lock:
            self._assumed.pop(instance, None)

    def assumed(self) -> list[str]:
        with self._lock:
            return sorted(self._assumed)

    def _settle(self, new: _State) -> None:
        """Forget the assumptions ``new`` shows settled or that expired (under the lock)."""
        now = time.monotonic()
        keep: dict[str, _Assumed] = {}
        for name, a in self._assumed.items():
            if a.until <= now:
                continue
            if new.seq > a.seq and (new.changed is None or name in new.changed):
                continue  # changed, perhaps after the decision: the store says what it holds now
            keep[name] = a
        self._assumed = keep

    def _delta(self, s: Session, old: _State, gens: dict[str, int], seq: int) -> _State:
        changed_insts: set[str] | None = set()
        files_changed, full = False, False
        if old.seq < 0:
            changed_insts, files_changed = None, True
        elif seq != old.seq:
            names, files_changed, complete = changes.since(s, old.seq)
            changed_insts = names if complete else None
        stale_workers = [n for n, g in gens.items() if old.gens.get(n) != g]
        changed = None if changed_insts is None else frozenset(changed_insts)
        if not stale_workers and len(gens) == len(old.gens) and changed_insts == set() and not files_changed:
            return _State(seq, old.gens, old.workers, old.instances, old.files, old.snapshot, old.occupancy, changed,
                          old.keys)
        workers = {n: w for n, w in old.workers.items() if n in gens and n not in stale_workers}
        keys = {n: k for n, k in old.keys.items() if n in workers}
        reload = _rewritten(s, stale_workers, old, workers, keys)
        for i in range(0, len(reload), 500):
            for row in s.exec(select(WorkerRow).where(WorkerRow.name.in_(reload[i:i + 500]))):
                for w in valid_workers([row]):
                    workers[w.name], keys[w.name] = w, row_key(*(getattr(row, c.key) for c in KEY_COLUMNS))
        self.stats.workers += len(reload)
        gone: list[Instance] = []
        if changed_insts is None:
            self.stats.full += 1
            rows = s.exec(select(InstanceRow).where(InstanceRow.state.in_(SHOWN)))
            instances = {r.name: instance_model(r) for r in rows}
            full = True
        else:
            instances = dict(old.instances)
            names = sorted(changed_insts)
            for n in names:
                was = instances.pop(n, None)
                if was is not None:
                    gone.append(was)
            for i in range(0, len(names), 500):
                for r in s.exec(select(InstanceRow).where(InstanceRow.name.in_(names[i:i + 500]),
                                                          InstanceRow.state.in_(SHOWN))):
                    instances[r.name] = instance_model(r)
            self.stats.instances += len(names)
        files = old.files
        if files_changed:
            files = [ModelFile(worker=f.worker, source=f.source, state=f.state) for f in s.exec(select(ModelFileRow))]
        listed = [workers[n] for n in sorted(workers)]
        snap = ClusterSnapshot.model_construct(  # each part validated when loaded; names are store keys, unique
            version=1, workers=listed, instances=[instances[n] for n in sorted(instances)], model_files=files)
        if full:
            occ = occupancy.build(listed, instances.values())
        else:
            occ = old.occupancy.derive(listed, instances, gone, [instances[n] for n in names if n in instances])
        occupancy.remember(snap, occ)
        if full:
            # The cached snapshot lives as long as the worker: move it (and what is alive now) out of
            # the collector's generations, so the policy's own allocations do not make every full
            # collection walk tens of thousands of cached objects (half a decision's time at 10,000
            # instances). Rare: the first load, or a cache behind the pruned log.
            gc.freeze()
        return _State(seq, gens, workers, instances, files, snap, occ, changed, keys)


KEY_COLUMNS = (WorkerRow.fingerprint, WorkerRow.state, WorkerRow.cordoned, WorkerRow.updated_at)


def row_key(fingerprint, state, cordoned, updated_at) -> tuple:
    """What says a worker row's content changed (KEY_COLUMNS): its report's fingerprint (every
    inventory field the snapshot's Worker reads), its state, its cordon, and when any of them was
    last written."""
    return (fingerprint, state, bool(cordoned), updated_at)


def _rewritten(s: Session, stale: list[str], old: _State, workers: dict[str, Worker], keys: dict[str, tuple]) -> list[str]:
    """Of the workers whose generation moved, those whose row must be read again: a booking or a
    release moves the generation without touching the row (the ledger changed, not the host), and
    in a burst nearly every move is one. Those keep their Worker, read back by a narrow query of the
    row's key (row_key) instead of the whole row and its GPUs' JSON (issue 37: 6% of the
    control-plane worker's Python time in a burst beside 500 running replicas)."""
    known = [n for n in stale if n in old.workers and n in old.keys]
    same: set[str] = set()
    for i in range(0, len(known), 500):
        for name, *key in s.exec(select(WorkerRow.name, *KEY_COLUMNS).where(WorkerRow.name.in_(known[i:i + 500]))):
            if row_key(*key) == old.keys[name]:
                same.add(name)
                workers[name], keys[name] = old.workers[name], old.keys[name]
    return [n for n in stale if n not in same]


def _overlay(state: _State, assumed: list[Instance], victims: set[str] = frozenset()) -> ClusterSnapshot:
    """``state``'s snapshot with the assumed placements in place of what the store shows of
    those instances (a PENDING row without a placement, usually), and without ``victims``."""
    by_name = {a.name: a for a in assumed}
    victims = {v for v in victims if v not in by_name}
    base = state.snapshot
    gone = [state.instances[n] for n in (*by_name, *victims) if n in state.instances]
    listed = [by_name.get(i.name, i) for i in base.instances if i.name not in victims]
    listed += [a for a in assumed if a.name not in state.instances]
    instances = {n: i for n, i in state.instances.items() if n not in victims}
    instances.update(by_name)
    snap = ClusterSnapshot.model_construct(version=1, workers=base.workers, instances=listed,
                                           model_files=base.model_files)
    occupancy.remember(snap, state.occupancy.derive(base.workers, instances, gone, assumed))
    return snap
