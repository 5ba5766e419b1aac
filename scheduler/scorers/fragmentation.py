"""Fragmentation: a multi-GPU placement that exists only because single GPUs are partly full.

A placement holds n GPUs and claims C bytes of VRAM on them. Empty, the fewest of those same GPUs
that would hold C is w: their totals, largest first, summed until they reach C. The placement is
*whole* when n <= w (each GPU it holds is needed for its size), *fragmented* when n > w (it is
in slivers). Examples, GPUs of 24 GiB:
- 20 GiB in 4 GiB pieces on 5 GPUs: C = 20, w = 1 < 5: fragmented;
- 40 GiB on 2 empty GPUs: C = 40, w = 2: whole;
- vLLM at --gpu-memory-utilization 0.9 on 2 GPUs: C = 2 x 21.6 = 43.2, w = 2: whole.
One GPU, or none, is always whole. Across workers (subordinates) every GPU held counts.

GPUStack has no such notion: it takes the first strategy that yields any candidate and scores
by binpack or spread alone, so a partly full cluster splits a replica that fits one GPU. Here,
when a decision's candidates mix both kinds, the ``fragmentation`` scorer gives whole ones 100
and fragmented ones 0, with a weight above the other scorers' sum (PolicyConfig.fragmentation),
so a fragmented placement never wins over a whole one; when all are of one kind the scorer does
not run and the scores are GPUStack's. ``whole_only`` drops fragmented candidates (a tenant
within its guarantee takes whole GPUs by preemption instead: scheduler/tenancy/admit.py)."""

from __future__ import annotations

from scheduler.cluster import Worker


def whole_count(totals: list[int], claim: int) -> int:
    """The fewest of these GPUs (their totals, in bytes) that would hold ``claim`` bytes empty."""
    n, held = 0, 0
    for t in sorted(totals, reverse=True):
        if held >= claim:
            break
        held += t
        n += 1
    return max(n, 1)


def _parts(c):
    yield c.worker, c.gpu_indexes, c.claim.vram
    for s in c.subordinates:
        yield s.worker, s.gpu_indexes, s.claim.vram


def fragmented(c, workers: dict[str, Worker], _totals: dict | None = None) -> bool:
    """Whether candidate ``c`` holds more GPUs than its claim needs on those GPUs empty.
    ``_totals``: a cache of each worker's GPU totals by index, shared by one decision's candidates."""
    held = len(c.gpu_indexes) + sum(len(s.gpu_indexes) for s in c.subordinates)
    if held < 2:
        return False
    cache = {} if _totals is None else _totals
    totals, claim = [], 0
    for w, gpus, vram in _parts(c):
        by_index = cache.get(w)
        if by_index is None:
            by_index = cache[w] = {g.index: g.vram_total for g in workers[w].gpus} if w in workers else {}
        totals += [by_index.get(i, 0) for i in gpus]
        claim += sum(vram.get(i, 0) for i in gpus)
    return held > whole_count(totals, claim)


def flags(cands, workers: dict[str, Worker]) -> list[bool]:
    cache: dict = {}
    return [fragmented(c, workers, cache) for c in cands]


def scores(flagged: list[bool]) -> list[float]:
    """100 for a whole placement, 0 for a fragmented one."""
    return [0.0 if f else 100.0 for f in flagged]
