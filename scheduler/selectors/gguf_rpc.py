"""GGUF over llama.cpp RPC: one main worker's GPUs plus RPC servers on other workers' GPUs.

As GPUStack: the main worker is the one whose GPUs able to hold a layer sum the most; its GPUs
(all with room) enter the tensor split after the RPC GPUs, largest first, so the largest carries
the output layer. For k = 1, 2, ... servers every combination of k RPC-capable GPUs is tried; the
first k that offloads the whole model ends the search (with cpu_offloading, the search goes on and
keeps the combinations offloading the most layers; with --gpu-layers, the first k with any). All
combinations with the most layers are candidates, and the scorers choose among them.

Pruned, because they provably cannot win: offload counts below the best found so far (they are
dropped at the end anyway), counts whose one-GPU VRAM figure exceeds the combination's total
allocatable (``GGUFRequest.vram_floor``), counts where some GPU cannot hold its share even at the
least a layer costs (``_gpu_short``), and counts whose RAM (the same for every split) the main
worker lacks. Without cpu_offloading only full offload is tried.

Safety bounds (settings): ``max_rpc_servers`` (8) servers at most; above ``max_rpc_gpus`` (16)
RPC-capable GPUs the search is skipped with a warning, as GPUStack does.
"""

from __future__ import annotations

from itertools import combinations

from scheduler.decision import Candidate, Context, claim, subordinate
from scheduler.selectors.gguf_strategies import item_ram, item_vram, gpu_list
from scheduler.units import gib


def _main(ctx: Context, workers):
    """The worker whose GPUs able to hold one layer (of its own memory kind) sum the most; ties
    go to the first in order of total allocatable."""
    req, best, best_sum = ctx.request, None, 0
    for w in sorted(workers, key=lambda w: -ctx.allocatable[w.name].vram_total):
        a, layer = ctx.allocatable[w.name], req.layer_vram(w.unified_memory)
        if a.vram_total < layer:
            continue
        s = sum(v for v in a.vram.values() if v >= layer)
        if s > best_sum:
            best, best_sum = w, s
    return best


def _layer_range(ctx: Context, first_sum: int, uma: bool, best: int, cpu_offloading: bool) -> tuple[int, int]:
    """(highest, lowest) offload counts worth trying for this k, from its largest combination;
    (-1, -1) when none. GPUStack compares with the one-GPU UMA figure; we use the pool's kind."""
    req, total = ctx.request, ctx.request.total_layers
    need = (lambda n: req.vram_floor(n, uma))
    if req.gpu_layers:
        n = req.gpu_layers
        return (n, n) if first_sum >= need(n) else (-1, -1)
    if not cpu_offloading:
        return (total, total) if first_sum > need(total) else (-1, -1)
    for n in range(total, max(best, 1) - 1, -1):
        if first_sum > need(n):
            return n, max(best, 1)
    return -1, -1


def _most_layers(ctx: Context, main, main_gpus, combo, hi: int, lo: int, memo: dict):
    """(layers, estimate) for the most layers in [lo, hi] this combination holds, or None. The
    answer depends only on the allocatable sizes and memory kinds in split order, so combinations
    of equal GPUs share it (``memo``)."""
    req, total = ctx.request, ctx.request.total_layers
    a_main, uma, k = ctx.allocatable[main.name], main.unified_memory, len(combo)
    allocs = tuple(r[2] for r in combo) + tuple(al for _, al in main_gpus)
    kinds = tuple(w.unified_memory for w, _, _ in combo)
    whole = (allocs, kinds, hi, lo)
    if whole in memo:
        return memo[whole]
    memo[whole] = None
    room, remote_nonuma = sum(allocs), kinds.count(False)
    for n in range(hi, lo - 1, -1):
        key = (allocs, kinds, n)
        if key not in memo:
            memo[key] = None
            if room < req.vram_floor(n, uma, remote_nonuma, len(main_gpus) - 1):
                continue
            if _gpu_short(req, allocs, kinds, uma, n):
                continue
            item = req.run(allocs, ("rpc",) * k, gpu_layers=-1 if n == total else n)
            main_vram = [item_vram(item, k + i, uma) for i in range(len(main_gpus))]
            if item_ram(item, uma) + (sum(main_vram) if uma else 0) > a_main.ram:
                continue
            if any(v > al for v, (_, al) in zip(main_vram, main_gpus)):
                continue
            if any(item_vram(item, i, u) > al for i, (u, al) in enumerate(zip(kinds, allocs))):
                continue
            memo[key] = item
        if memo[key] is not None:
            memo[whole] = memo[key]
            return memo[key]
    return None


def _gpu_short(req, allocs, kinds, main_uma: bool, n: int) -> bool:
    """Whether some GPU of the split provably lacks room for its share of ``n`` layers (its
    buffers plus the least a layer costs, times the layers the split gives it), so no estimate
    is run. Kinds: the RPC servers', then the main worker's for each of its GPUs."""
    counts = req.layer_counts(allocs, -1 if n == req.total_layers else n)
    if counts is None:
        return False
    buffers, per_layer = req.rpc_server_floor(n)
    kinds = kinds + (main_uma,) * (len(allocs) - len(kinds))
    return any((0 if u or not c else buffers) + c * per_layer > al for u, c, al in zip(kinds, counts, allocs))


def _candidate(ctx: Context, main, main_gpus, combo, item) -> Candidate:
    total, uma, k = ctx.request.total_layers, main.unified_memory, len(combo)
    subs = [subordinate(w.name, [g.index], claim(vram={g.index: item_vram(item, i, w.unified_memory)},
                                                 offload_layers=item.vrams[i].handle_layers, total_layers=total,
                                                 is_unified_memory=w.unified_memory))
            for i, (w, g, _) in enumerate(combo)]
    vram = {g.index: item_vram(item, k + i, uma) for i, (g, _) in enumerate(main_gpus)}
    split = [r[2] for r in combo] + [al for _, al in main_gpus]
    return Candidate(main.name, [g.index for g, _ in main_gpus], claim(
        ram=item_ram(item, uma), vram=vram, offload_layers=item.offload_layers, total_layers=total,
        tensor_split=split, is_unified_memory=uma), subs, gpu_type=main_gpus[0][0].type)


def rpc(ctx: Context, workers, msgs, cpu_offloading: bool) -> list[Candidate]:
    req, cfg, total = ctx.request, ctx.config, ctx.request.total_layers
    main = _main(ctx, workers)
    if main is None:
        msgs.append(f"No GPU can hold one layer ({gib(req.layer_vram(False))} GiB).")
        return []
    gpus = gpu_list(ctx, workers)
    main_gpus = [(g, al) for w, g, al in gpus if w is main]
    pool = [r for r in gpus if r[0] is not main and r[2] >= req.rpc_layer_vram(r[0].unified_memory)]
    if not pool:
        msgs.append("No other worker has a GPU that can serve one layer over RPC.")
        return []
    manual = bool(ctx.spec.gpu_selector.gpu_ids)
    short = [f"{w.name}:{g.type}:{g.index}" for w, g, al in gpus if w is not main and (w, g, al) not in pool]
    if manual and short:
        msgs.append(f"Selected GPU {short[0]} lacks enough VRAM to serve as an RPC server "
                    f"(one layer needs {gib(req.rpc_layer_vram(False))} GiB).")
        return []
    if len(pool) > cfg.max_rpc_gpus and not manual:
        msgs.append(f"Too many candidate RPC servers ({len(pool)}, max {cfg.max_rpc_gpus}); skipping distributed deployment.")
        return []
    uma_pool = main.unified_memory or any(w.unified_memory for w, _, _ in pool)
    main_sum = sum(al for _, al in main_gpus)
    counts = [len(pool)] if manual else range(1, min(len(pool), cfg.max_rpc_servers) + 1)
    found, best, memo = [], -1, {}
    for k in counts:
        hi, lo = _layer_range(ctx, main_sum + sum(r[2] for r in pool[:k]), uma_pool, best, cpu_offloading)
        while hi >= max(lo, best, 0) and item_ram(req.one_gpu(hi), main.unified_memory) > ctx.allocatable[main.name].ram:
            hi -= 1  # the CPU's share is the same for every split: short here, short for every combination
        if hi < max(lo, best, 0):
            continue
        for combo in combinations(pool, k):
            item = _most_layers(ctx, main, main_gpus, combo, hi, max(lo, best), memo)
            if item is not None and item.offload_layers >= best:
                best = item.offload_layers
                found.append((combo, item))
        if best == total or (req.gpu_layers and found):
            break
    found = [_candidate(ctx, main, main_gpus, combo, item) for combo, item in found if item.offload_layers == best]
    if not found or (not cpu_offloading and best != total):
        msgs.append("No combination of RPC servers can hold the model.")
        return []
    return found
