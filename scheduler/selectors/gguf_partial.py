"""GGUF partial offload (needs cpu_offloading): some layers on the GPUs of one worker, the rest
on its CPU, as GPUStack's two passes do.

1. One GPU per worker: workers in order of allocatable VRAM; on each, its GPUs largest first,
   the most layers the GPU holds (RAM permitting). A worker counts only if it reaches the best
   count so far; the first such GPU on it is its candidate.
2. Several GPUs of one worker: for 2, 3, ... GPUs, the combinations of its GPUs able to hold a
   layer (largest first; one when all are equal), each run with a tensor split of their
   allocatable; the most layers each holds. More GPUs are tried only while the best count grows.
   A worker's candidates are its fewest GPUs at its most layers.
The candidates are those with the most layers overall. Counts below the best so far, counts
whose RAM (the same for every split) the worker lacks, and counts whose one-GPU figure (plus a
platform footprint per further GPU) exceeds a combination's total are not run: they cannot win.
"""

from __future__ import annotations

import bisect
from itertools import combinations

from scheduler.decision import Candidate, Context, claim
from scheduler.selectors.gguf_strategies import item_ram, item_vram
from scheduler.units import gib


def _one_gpu(ctx: Context, w, best: int) -> Candidate | None:
    req, a, uma = ctx.request, ctx.allocatable[w.name], w.unified_memory
    cur = req.one_gpu(best)
    if a.vram_total < req.layer_vram(uma) or a.vram_total < item_vram(cur, 0, uma):
        return None
    if uma and a.ram < item_vram(cur, 0, uma) + item_ram(cur, uma):
        return None
    gpus = sorted(w.gpus, key=lambda g: -a.vram.get(g.index, 0))
    if req.gpu_layers:  # the user fixed the count: the largest GPU holds it, or none does
        g = gpus[0]
        if item_ram(cur, uma) > a.ram or a.vram.get(g.index, 0) <= item_vram(cur, 0, uma):
            return None
        return _make(ctx, w, [g.index], cur, {g.index: item_vram(cur, 0, uma)})
    items = [i for i in req.items[1:-1] if i.offload_layers >= best]
    keys = [item_vram(i, 0, uma) for i in items]
    for g in gpus:
        alloc = a.vram.get(g.index, 0)
        if alloc < req.layer_vram(uma):
            continue
        n = bisect.bisect_right(keys, alloc)
        if n == 0:
            break  # smaller GPUs follow
        item = items[n - 1]
        if item_ram(item, uma) > a.ram - (item_vram(item, 0, uma) if uma else 0):
            continue
        if item.offload_layers < best:
            break
        return _make(ctx, w, [g.index], item, {g.index: item_vram(item, 0, uma)})
    return None


def _combo(ctx: Context, w, combo, best: int, memo: dict):
    """The most layers (>= best, short of full) this set of GPUs holds, as a candidate."""
    req, a, uma = ctx.request, ctx.allocatable[w.name], w.unified_memory
    allocs = tuple(al for _, al in combo)
    counts = [req.gpu_layers] if req.gpu_layers else range(len(req.items) - 2, max(best, 1) - 1, -1)
    for n in counts:
        if sum(allocs) < req.vram_floor(n, uma, 0, len(combo) - 1) or item_ram(req.one_gpu(n), uma) > a.ram:
            continue
        key = ("partial", allocs, uma, n)
        if key not in memo:
            item = req.run(allocs, gpu_layers=n)
            vram = [item_vram(item, i, uma) for i in range(len(combo))]
            ok = (item_ram(item, uma) + (sum(vram) if uma else 0) <= a.ram
                  and all(v <= al for v, al in zip(vram, allocs)))
            memo[key] = (item, vram) if ok else None
        if memo[key] is not None:
            item, vram = memo[key]
            return _make(ctx, w, [g.index for g, _ in combo], item, {g.index: v for (g, _), v in zip(combo, vram)},
                         list(allocs))
    return None


def _several_gpus(ctx: Context, w, best: int, memo: dict) -> list[Candidate]:
    req, a, uma = ctx.request, ctx.allocatable[w.name], w.unified_memory
    if len(w.gpus) < 2 or a.vram_total < req.layer_vram(uma) or a.vram_total < item_vram(req.one_gpu(best), 0, uma):
        return []
    first = a.vram.get(w.gpus[0].index, 0)
    usable = [(g, a.vram.get(g.index, 0)) for g in w.gpus if a.vram.get(g.index, 0) >= req.layer_vram(uma)]
    equal = all(al == first for _, al in usable)
    usable.sort(key=lambda x: -x[1])
    found, prev = [], best
    for count in range(2, len(w.gpus) + 1):
        need = item_vram(req.one_gpu(best), 0, uma)
        if count > len(usable) or sum(al for _, al in usable[:count]) < need:
            continue
        for i, combo in enumerate(combinations(usable, count)):
            if sum(al for _, al in combo) < need:
                break  # GPUStack's rule: later combinations of this size are taken to be smaller
            c = _combo(ctx, w, combo, best, memo)
            if c is not None and c.claim.offload_layers >= best:
                best, need = c.claim.offload_layers, item_vram(req.one_gpu(c.claim.offload_layers), 0, uma)
                found.append(c)
            if equal and i > 0:
                break
        if prev and best <= prev:
            break
        prev = best
    if not found:
        return []
    top = max(c.claim.offload_layers for c in found)
    fewest = min(len(c.gpu_indexes) for c in found if c.claim.offload_layers == top)
    return [c for c in found if c.claim.offload_layers == top and len(c.gpu_indexes) == fewest]


def _make(ctx: Context, w, gpu_indexes, item, vram, tensor_split=None) -> Candidate:
    uma = w.unified_memory
    return Candidate(w.name, gpu_indexes, claim(ram=item_ram(item, uma), vram=vram, offload_layers=item.offload_layers,
                                                total_layers=ctx.request.total_layers, tensor_split=tensor_split,
                                                is_unified_memory=uma), gpu_type=w.gpu(gpu_indexes[0]).type)


def partial(ctx: Context, workers, msgs) -> list[Candidate]:
    req = ctx.request
    best = req.gpu_layers or 0
    found = []
    manual = bool(ctx.spec.gpu_selector.gpu_ids)
    for w in workers:
        if w.gpus and not req.user_tensor_split and not (manual and len(w.gpus) > 1):
            c = _one_gpu(ctx, w, best)
            if c is not None and c.claim.offload_layers >= best:
                best = c.claim.offload_layers
                found.append(c)
    memo: dict = {}
    for w in workers:
        if w.gpus:
            cs = _several_gpus(ctx, w, best, memo)
            if cs and cs[0].claim.offload_layers >= best:
                best = cs[0].claim.offload_layers
                found.extend(cs)
    found = [c for c in found if c.claim.offload_layers == best and best > 0]
    if not found:
        msgs.append(f"No GPU can hold even one layer ({gib(req.layer_vram(False))} GiB) beside the CPU's share.")
    return found
