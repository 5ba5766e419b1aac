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


def fragmented(c, workers: dict[str, Worker]) -> bool:
    """Whether candidate ``c`` holds more GPUs than its claim needs on those GPUs empty: n GPUs
    are more than w exactly when the n - 1 largest of them hold the claim, that is when their
    totals less the smallest reach it (no sort: this runs for every multi-GPU candidate)."""
    held = len(c.gpu_indexes) + sum(len(s.gpu_indexes) for s in c.subordinates)
    if held < 2:
        return False
    total, smallest, claim = 0, None, 0
    for w, gpus, vram in _parts(c):
        listed = workers[w].gpus if w in workers else []
        for i in gpus:
            g = listed[i] if i < len(listed) and listed[i].index == i else next((x for x in listed if x.index == i), None)
            t = g.vram_total if g is not None else 0
            total += t
            smallest = t if smallest is None or t < smallest else smallest
            claim += vram.get(i, 0)
    return total - smallest >= claim


def flags(cands, workers: dict[str, Worker]) -> list[bool]:
    """``fragmented`` of each candidate; a candidate on one worker whose GPUs are all of one size
    t takes the short form (n - 1) * t >= claim."""
    same: dict[str, int | None] = {}  # worker -> the size of all its GPUs, None when they differ
    out = []
    for c in cands:
        n = len(c.gpu_indexes)
        if c.subordinates or n < 2:
            out.append(fragmented(c, workers))
            continue
        t = same.get(c.worker, 0)
        if t == 0:
            sizes = {g.vram_total for g in workers[c.worker].gpus} if c.worker in workers else set()
            t = same[c.worker] = sizes.pop() if len(sizes) == 1 else None
        out.append((n - 1) * t >= sum(c.claim.vram.values()) if t is not None else fragmented(c, workers))
    return out


def scores(flagged: list[bool]) -> list[float]:
    """100 for a whole placement, 0 for a fragmented one."""
    return [0.0 if f else 100.0 for f in flagged]
