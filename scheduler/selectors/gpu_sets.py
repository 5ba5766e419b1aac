"""Which n-GPU sets of one worker a multi-GPU strategy tries. By memory alone the strategies
take one set (the GPUs with the most allocatable first); on a worker that reports topology,
sets that fit as well but are better joined are worth scoring too (scorers/topology.py).

Order, on a worker that reports topology: the strategy's first set, then the sets inside each
NVLink group (GPUs joined by NVLink, directly or through each other), inside each PCIe switch,
inside each NUMA node, then every set in the strategy's own order; repeats dropped, at most
``limit``. Of these, one candidate per interconnect level is kept (the first that fits), so a
worker offers at most 7 sets, not dozens. A worker without topology gets exactly the strategy's
own order and its one set, so its decisions do not move.
"""

from __future__ import annotations

from itertools import combinations, islice
from typing import Callable, Iterable, Iterator, TypeVar

from scheduler.cluster import GPU, Worker
from scheduler.interconnect import NVLINK, SCORE, level, memo, reports

T = TypeVar("T")
C = TypeVar("C")
MAX_SETS = 64  # sets of one size tried per worker
BEST = SCORE[NVLINK]


def _nvlink_groups(w: Worker) -> list[set[int]]:
    """Connected components of the NVLink graph (peers named on either side)."""
    nbrs: dict[int, set[int]] = {g.index: set() for g in w.gpus}
    for g in w.gpus:
        for p in g.nvlink_peers or ():
            if p in nbrs:
                nbrs[g.index].add(p)
                nbrs[p].add(g.index)
    seen: set[int] = set()
    out = []
    for g in w.gpus:
        if g.index in seen or not nbrs[g.index]:
            continue
        comp, todo = set(), [g.index]
        while todo:
            i = todo.pop()
            if i not in comp:
                comp.add(i)
                todo.extend(nbrs[i] - comp)
        seen |= comp
        out.append(comp)
    return out


def _groups(w: Worker) -> list[set[int]]:
    """NVLink groups, then PCIe switches, then NUMA nodes (each as GPU indexes); once per worker report."""
    m = memo(w)
    if "groups" not in m:
        m["groups"] = _find_groups(w)
    return m["groups"]


def _find_groups(w: Worker) -> list[set[int]]:
    by: dict[tuple[str, object], set[int]] = {}
    for g in w.gpus:
        if g.pcie_switch is not None:
            by.setdefault(("switch", g.pcie_switch), set()).add(g.index)
    for g in w.gpus:
        if g.numa_node is not None:
            by.setdefault(("numa", g.numa_node), set()).add(g.index)
    return _nvlink_groups(w) + list(by.values())


def ordered(w: Worker, items: list[T], n: int, gpu: Callable[[T], GPU] = lambda x: x,
            limit: int = MAX_SETS) -> Iterator[tuple[T, ...]]:
    """The n-item combinations of ``items`` (GPUs, or rows holding one) to try: on a worker without
    topology, the strategy's own order; otherwise its first set, then the groups' sets, then the rest."""
    if not reports(w):
        yield from combinations(items, n)
        return
    seen: set[frozenset[int]] = set()
    idx = [gpu(x).index for x in items]  # combinations of positions: the same order as of the items
    pos = range(len(items))

    def runs() -> Iterator[Iterable[tuple[int, ...]]]:  # lazily: a caller often stops in the first groups
        yield islice(combinations(pos, n), 1)
        for group in _groups(w):
            inside = [p for p in pos if idx[p] in group]
            if len(inside) >= n:
                yield combinations(inside, n)
        yield combinations(pos, n)

    for run in runs():
        for comb in run:
            key = frozenset([idx[p] for p in comb])
            if key in seen:
                continue
            seen.add(key)
            yield tuple(items[p] for p in comb)
            if len(seen) >= limit:
                return


def first_per_level(w: Worker, cands: list[C]) -> list[C]:
    """On a worker that reports topology, the first candidate of each interconnect level: sets
    joined alike fit alike, and the first (by memory) stands for its level. Elsewhere all of them."""
    if not reports(w):
        return cands
    out, levels = [], set()
    for c in cands:
        lv = level(w, c.gpu_indexes)
        if lv not in levels:
            levels.add(lv)
            out.append(c)
    return out


def better(w: Worker, items: list[T], chosen: list[T], build: Callable[[list[T]], C | None],
           gpu: Callable[[T], GPU] = lambda x: x, limit: int = MAX_SETS) -> list[C]:
    """On a worker that reports topology: beside ``chosen`` (the set a strategy found by memory),
    a candidate for each interconnect level better than chosen's, built from the first set of that
    level that ``build`` accepts (it returns None for a set that does not fit). [] elsewhere."""
    if not reports(w) or len(chosen) < 2:
        return []
    base = _score(w, [gpu(x) for x in chosen])
    out, done = [], set()
    for comb in ordered(w, items, len(chosen), gpu, limit):
        s = _score(w, [gpu(x) for x in comb])
        if s <= base or s in done:
            continue
        c = build(list(comb))
        if c is not None:
            done.add(s)
            out.append(c)
            if s >= BEST:
                break  # nothing is better joined than all pairs on NVLink
    return out


def _score(w: Worker, gpus: list[GPU]) -> float:
    lv = level(w, [g.index for g in gpus])  # level_of(gpus), remembered per worker (the GPUs are w's)
    return SCORE[lv] if lv is not None else 0.0
