"""What the placed instances hold on each worker, summed once per snapshot rather than once per
decision: claimed RAM and VRAM per GPU (allocatable.py subtracts them from what a worker has),
GPU slots per model (the spread scorer's counts), and each worker's allocatable.

``of(snapshot)`` builds it from the snapshot and remembers it for as long as the snapshot lives
(a snapshot is never changed in place; ``model_copy(update=...)`` makes a new one, which gets its
own). The snapshot cache derives each new snapshot's occupancy from the previous one with
``derive``: the instances that changed are taken out in their old version and put back in their
new one, and only the workers they touch (or whose row changed) are summed again. The sums are
of integers, so a derived occupancy equals a built one exactly (tests/test_occupancy.py), and
both equal allocatable.allocatable_map and spread.count, the per-decision computations they
replace (still used by scale-down ranking).

An instance part (the main placement or a subordinate) on a worker counts, as in spread.count,
one slot per GPU, or one slot when it holds no GPU.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Iterable

from scheduler.allocatable import Allocatable, allocatable
from scheduler.cluster import ClusterSnapshot, Instance, Worker
from scheduler.interconnect import reports
from scheduler.memo import ByIdentity
from scheduler.scorers.spread import Counts


@dataclass(slots=True)
class ModelSlots:
    slots: int = 0
    gpu_slots: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class Held:
    """One worker's share of every placed instance (duck-types allocatable.Allocated)."""

    ram: int = 0
    vram: dict[int, int] = field(default_factory=dict)
    slots: int = 0
    gpu_slots: dict[int, int] = field(default_factory=dict)
    models: dict[str, ModelSlots] = field(default_factory=dict)

    def copy(self) -> "Held":
        return Held(self.ram, dict(self.vram), self.slots, dict(self.gpu_slots),
                    {m: ModelSlots(s.slots, dict(s.gpu_slots)) for m, s in self.models.items()})


def _parts(inst: Instance):
    if inst.worker is not None:
        yield inst.worker, inst.gpu_indexes, inst.claim
    for s in inst.subordinates:
        if s.worker is not None:
            yield s.worker, s.gpu_indexes, s.claim


def _add(h: Held, model: str, gpus: list[int], claim, sign: int) -> None:
    h.ram += sign * claim.ram
    for idx, b in claim.vram.items():
        h.vram[idx] = h.vram.get(idx, 0) + sign * b
    m = h.models.get(model)
    if m is None:
        m = h.models[model] = ModelSlots()
    n = len(gpus) or 1
    h.slots += sign * n
    m.slots += sign * n
    for g in gpus:
        h.gpu_slots[g] = h.gpu_slots.get(g, 0) + sign
        m.gpu_slots[g] = m.gpu_slots.get(g, 0) + sign
    if not m.slots:
        del h.models[model]


class Occupancy:
    """Per worker: ``held`` (workers holding no instance are absent) and ``allocatable`` (every
    worker of the snapshot). ``instances`` maps names to the instances summed."""

    __slots__ = ("held", "allocatable", "workers", "instances", "reporting", "foreign", "_counts", "_bases",
                 "_margined", "_lock")

    def __init__(self, held: dict[str, Held], allocatable_: dict[str, Allocatable], workers: dict[str, Worker],
                 instances: dict[str, Instance], reporting: frozenset[str], foreign: frozenset[str] = frozenset()) -> None:
        self.held, self.allocatable, self.workers = held, allocatable_, workers
        self.instances, self.reporting = instances, reporting
        self.foreign = foreign  # workers with a GPU that other processes use (scheduler/foreign.py)
        self._counts: dict[str, dict[str, Counts]] = {}
        # per model, the nearest ancestor's spread counts and the workers whose sums changed since:
        # that model's counts here are the ancestor's with only those workers counted again
        self._bases: dict[str, tuple[dict[str, Counts], frozenset[str]]] = {}
        self._margined: dict[float, dict[str, Allocatable]] = {}
        self._lock = threading.Lock()

    def allocatable_with(self, margin: float) -> dict[str, Allocatable]:
        """``allocatable`` with foreign use booked with ``margin`` (scheduler/foreign.py): only the
        workers other processes use are summed again, once per margin."""
        if not margin or not self.foreign:
            return self.allocatable
        with self._lock:
            done = self._margined.get(margin)
        if done is None:
            done = dict(self.allocatable)
            for n in self.foreign:
                done[n] = allocatable(self.workers[n], self.held.get(n), margin)
            with self._lock:
                self._margined[margin] = done
        return done

    @property
    def topology(self) -> bool:
        """Whether some worker reports topology (scorers/topology.py runs only then)."""
        return bool(self.reporting)

    def derive(self, workers: list[Worker], instances: dict[str, Instance],
               gone: Iterable[Instance], came: Iterable[Instance]) -> "Occupancy":
        """The occupancy of a snapshot with ``workers`` and ``instances``, where the instances
        ``gone`` (old versions) left and ``came`` (new versions) arrived since this one."""
        held = dict(self.held)
        touched: set[str] = set()
        for sign, insts in ((-1, gone), (1, came)):
            for inst in insts:
                for w, gpus, claim in _parts(inst):
                    if w not in touched:
                        touched.add(w)
                        held[w] = held[w].copy() if w in held else Held()
                    _add(held[w], inst.model, gpus, claim, sign)
        for w in touched:
            if not held[w].slots:
                del held[w]  # every part adds a slot: none left means nothing held
        old_w, old_a = self.workers, self.allocatable
        alloc, by_name = {}, {}
        reporting, foreign = set(self.reporting), set(self.foreign)
        for w in workers:
            n = w.name
            by_name[n] = w
            if n in touched or old_w.get(n) is not w:
                alloc[n] = allocatable(w, held.get(n))
                (reporting.add if reports(w) else reporting.discard)(n)
                (foreign.add if any(g.vram_foreign for g in w.gpus) else foreign.discard)(n)
            else:
                alloc[n] = old_a[n]
        out = Occupancy(held, alloc, by_name, instances, frozenset(reporting & by_name.keys()),
                        frozenset(foreign & by_name.keys()))
        out._bases = self._successor_bases(touched)
        return out

    def _successor_bases(self, touched: set[str]) -> dict[str, tuple[dict[str, Counts], frozenset[str]]]:
        """What a derived occupancy counts each model from: this one's counts of it, or else this
        one's base for it, with ``touched`` added. A model is dropped once more workers changed than
        BASE_SHARE of those holding something (counting them all again is as cheap); the
        BASES_KEPT models counted last are kept (a burst decides a few deployments in turn)."""
        with self._lock:
            mine = list(self._counts.items())
        limit = max(8, len(self.held) * BASE_SHARE)
        out = {}
        for m, (counts, since) in [*self._bases.items(), *((m, (c, frozenset())) for m, c in mine)]:
            out.pop(m, None)  # this one's own counts replace its base's, and come last (the most recent)
            since = since | touched
            if len(since) <= limit:
                out[m] = (counts, since)
        return dict(list(out.items())[-BASES_KEPT:])

    def without(self, name: str | None) -> "Occupancy":
        """This occupancy with instance ``name`` left out (a replica being placed again)."""
        inst = self.instances.get(name) if name is not None else None
        if inst is None or not any(True for _ in _parts(inst)):
            return self
        rest = dict(self.instances)
        del rest[name]
        return self.derive(list(self.workers.values()), rest, [inst], [])

    def spread_counts(self, model: str) -> dict[str, Counts]:
        """spread.count(instances, model), from the sums."""
        with self._lock:
            done = self._counts.get(model)
        if done is not None:
            return done
        base = self._bases.get(model)
        if base is not None:  # an ancestor's, with the workers changed since counted again
            out = dict(base[0])
            for w in base[1]:
                if w in self.held:
                    out[w] = self._count(w, model)
                else:
                    out.pop(w, None)
        else:
            out = {w: self._count(w, model) for w in self.held}
        with self._lock:
            self._counts[model] = out
        return out

    def _count(self, w: str, model: str) -> Counts:
        h = self.held[w]
        m = h.models.get(model)
        cur = {g: n for g, n in m.gpu_slots.items() if n} if m is not None else {}
        oth = {g: d for g, n in h.gpu_slots.items() if (d := n - cur.get(g, 0))}
        mine = m.slots if m is not None else 0
        return Counts(mine, h.slots - mine, cur, oth)


BASE_SHARE = 0.25  # a derived occupancy's spread counts start from an ancestor's while at most this share changed
BASES_KEPT = 32  # and for at most this many models (the ones counted last)
EMPTY = Occupancy({}, {}, {}, {}, frozenset())


def build(workers: list[Worker], instances: Iterable[Instance]) -> Occupancy:
    insts = {i.name: i for i in instances}
    return EMPTY.derive(workers, insts, [], insts.values())


_MEMO = ByIdentity()  # snapshot -> (its workers list, its instances list, Occupancy)


def of(snapshot: ClusterSnapshot) -> Occupancy:
    """The snapshot's occupancy, built on first use and remembered while the snapshot lives."""
    m = _MEMO.get(snapshot)
    if m is not None and m[0] is snapshot.workers and m[1] is snapshot.instances:
        return m[2]
    occ = build(snapshot.workers, snapshot.instances)
    remember(snapshot, occ)
    return occ


def remember(snapshot: ClusterSnapshot, occ: Occupancy) -> None:
    """Record ``occ`` as the occupancy of ``snapshot`` (the snapshot cache derives it)."""
    _MEMO.put(snapshot, (snapshot.workers, snapshot.instances, occ))
