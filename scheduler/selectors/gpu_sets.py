"""Which n-GPU sets of one worker a multi-GPU strategy tries. By memory alone the strategies
take one set (the GPUs with the most allocatable first); on a worker that reports topology,
sets that fit as well but are better joined are worth scoring too (scorers/topology.py).

Order, on a worker that reports topology: the sets inside each NVLink group (GPUs joined by
NVLink, directly or through each other), then inside each PCIe switch, then inside each NUMA node,
then every set in the strategy's own order; repeats dropped, at most ``limit``. A worker without
topology gets exactly the strategy's own order, so its decisions do not move.
"""

from __future__ import annotations

from itertools import combinations, islice
from typing import Callable, Iterable, Iterator, TypeVar

from scheduler.cluster import GPU, Worker
from scheduler.interconnect import reports

T = TypeVar("T")
MAX_SETS = 64  # sets of one size tried per worker


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
    """NVLink groups, then PCIe switches, then NUMA nodes (each as GPU indexes)."""
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
    """The n-item combinations of ``items`` (GPUs, or rows holding one) to try, in the order above."""
    if not reports(w):
        yield from combinations(items, n)
        return
    seen: set[frozenset[int]] = set()
    runs: list[Iterable[tuple[T, ...]]] = []
    for group in _groups(w):
        inside = [x for x in items if gpu(x).index in group]
        if len(inside) >= n:
            runs.append(combinations(inside, n))
    runs.append(combinations(items, n))
    for run in runs:
        for comb in run:
            key = frozenset(gpu(x).index for x in comb)
            if key in seen:
                continue
            seen.add(key)
            yield comb
            if len(seen) >= limit:
                return


def others(w: Worker, items: list[T], chosen: list[T], gpu: Callable[[T], GPU] = lambda x: x,
           limit: int = MAX_SETS) -> list[tuple[T, ...]]:
    """On a worker that reports topology: the other sets of len(chosen) to try beside ``chosen``
    (which a strategy found by memory); [] elsewhere."""
    if not reports(w) or len(chosen) < 2:
        return []
    mine = frozenset(gpu(x).index for x in chosen)
    return [c for c in islice(ordered(w, items, len(chosen), gpu, limit), limit)
            if frozenset(gpu(x).index for x in c) != mine]
