"""GGUF over llama.cpp RPC: one main worker's GPUs plus RPC servers on other workers' GPUs.

As GPUStack: the main worker is the one whose GPUs able to hold a layer sum the most; its GPUs
(all with room) enter the tensor split after the RPC GPUs, largest first, so the largest carries
the output layer. For k = 1, 2, ... servers every combination of k RPC-capable GPUs is tried; the
first k that offloads the whole model ends the search (with cpu_offloading, the search goes on and
keeps the combinations offloading the most layers; with --gpu-layers, the first k with any). All
combinations with the most layers are candidates, and the scorers choose among them.

Pruned, because they provably cannot win: offload counts below the best found so far (they are
dropped at the end anyway), and counts whose one-GPU VRAM figure exceeds the combination's total
allocatable (``GGUFRequest.vram_floor``). Without cpu_offloading only full offload is tried.

Safety bounds (settings): ``max_rpc_servers`` (8) servers at most; above ``max_rpc_gpus`` (16)
RPC-capable GPUs the search is skipped with a warning, as GPUStack does.
"""

from __future__ import annotations

from itertools import combinations

from scheduler.decision import Candidate, Context, claim, subordinate
from scheduler.selectors.gguf_strategies import _ram, _vram, gpu_list
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


def _try(ctx: Context, main, main_gpus, combo, hi: int, lo: int):
    """The most layers in [lo, hi] this combination holds, as a candidate; None if none."""
    req, total = ctx.request, ctx.request.total_layers
    a_main = ctx.allocatable[main.name]
    allocs = [r[2] for r in combo] + [al for _, al in main_gpus]
    uma_any = main.unified_memory or any(w.unified_memory for w, _, _ in combo)
    servers = tuple(f"{w.name}:{50053 + i}" for i, (w, _, _) in enumerate(combo))
    k, uma = len(combo), main.unified_memory
    for n in range(hi, lo - 1, -1):
        if sum(allocs) < req.vram_floor(n, uma_any):
            continue
        item = req.run(tuple(allocs), servers, gpu_layers=-1 if n == total else n)
        vram = {g.index: _vram(item, k + i, uma) for i, (g, _) in enumerate(main_gpus)}
        ram = _ram(item, uma)
        if ram + (sum(vram.values()) if uma else 0) > a_main.ram:
            continue
        if any(vram[g.index] > al for g, al in main_gpus):
            continue
        if any(_vram(item, i, w.unified_memory) > al for i, (w, _, al) in enumerate(combo)):
            continue
        subs = [subordinate(w.name, [g.index], claim(vram={g.index: _vram(item, i, w.unified_memory)},
                                                     offload_layers=item.vrams[i].handle_layers, total_layers=total,
                                                     is_unified_memory=w.unified_memory))
                for i, (w, g, _) in enumerate(combo)]
        return Candidate(main.name, [g.index for g, _ in main_gpus], claim(
            ram=ram, vram=vram, offload_layers=item.offload_layers, total_layers=total,
            tensor_split=allocs, is_unified_memory=uma), subs, gpu_type=main_gpus[0][0].type)
    return None


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
    found, best = [], -1
    for k in counts:
        hi, lo = _layer_range(ctx, main_sum + sum(r[2] for r in pool[:k]), uma_pool, best, cpu_offloading)
        if hi < 0:
            continue
        for combo in combinations(pool, k):
            c = _try(ctx, main, main_gpus, combo, hi, max(lo, best))
            if c is not None and c.claim.offload_layers >= best:
                best = c.claim.offload_layers
                found.append(c)
        if best == total or (req.gpu_layers and found):
            break
    found = [c for c in found if c.claim.offload_layers == best]
    if not found or (not cpu_offloading and best != total):
        msgs.append("No combination of RPC servers can hold the model.")
        return []
    return found
