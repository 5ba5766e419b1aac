"""GGUF (llama.cpp) placement strategies, each costed with llama.cpp's memory model.

Claims use the worker's memory kind: unified-memory (UMA) figures on Apple-style workers,
discrete (NonUMA) elsewhere. Departures from GPUStack, on purpose:
- the single-GPU scan skips a worker short of RAM instead of stopping altogether;
- the RPC layer pre-check uses each figure of the worker's own memory kind (GPUStack: UMA always);
- the RPC search is bounded: for k servers it tries the k largest RPC-capable GPUs.
"""

from __future__ import annotations

import bisect
from itertools import combinations, islice

from scheduler.decision import Candidate, Context, claim, subordinate
from scheduler.gguf.estimate import EstimateItem
from scheduler.interconnect import reports
from scheduler.selectors import gpu_sets
from scheduler.units import gib

MAX_COMBINATIONS = 32  # tensor-split runs tried per GPU count on one worker


def _vram(item: EstimateItem, i: int, uma: bool) -> int:
    return item.vrams[i].uma if uma else item.vrams[i].nonuma


def _ram(item: EstimateItem, uma: bool) -> int:
    return item.ram.uma if uma else item.ram.nonuma


def _ram_ok(ram_claim: int, vram_claim: int, alloc_ram: int, uma: bool) -> bool:
    return ram_claim <= (alloc_ram - vram_claim if uma else alloc_ram)


def gpu_list(ctx: Context, workers) -> list[tuple]:
    """(worker, gpu, allocatable) for every GPU with room, largest first (stable)."""
    rows = [(w, g, ctx.allocatable[w.name].vram.get(g.index, 0)) for w in workers for g in w.gpus]
    return sorted((r for r in rows if r[2] > 0), key=lambda r: -r[2])


def single_gpu(ctx: Context, workers, msgs) -> list[Candidate]:
    req, out = ctx.request, []
    full, total = req.full, req.total_layers
    need = {uma: (_vram(full, 0, uma), _ram(full, uma)) for uma in (False, True)}
    for w, g, alloc in gpu_list(ctx, workers):
        uma = w.unified_memory
        v, r = need[uma]
        if v > alloc or not _ram_ok(r, v, ctx.allocatable[w.name].ram, uma):
            continue
        out.append(Candidate(w.name, [g.index], claim(ram=r, vram={g.index: v}, offload_layers=total,
                                                        total_layers=total, is_unified_memory=uma), gpu_type=g.type))
    if not out:
        msgs.append(f"No GPU can hold the whole model: it needs {gib(need[False][0])} GiB of VRAM "
                    f"and {gib(need[False][1])} GiB of RAM.")
    return out


def _fits(item: EstimateItem, allocs: list[int], alloc_ram: int, uma: bool, offset: int = 0) -> bool:
    if not _ram_ok(_ram(item, uma), 0, alloc_ram, uma):
        return False
    return all(_vram(item, offset + i, uma) <= a for i, a in enumerate(allocs))


def multi_gpu(ctx: Context, workers, msgs, gpu_layers: int = -1) -> list[Candidate]:
    """Full offload over several GPUs of one worker, with a tensor split of their allocatable."""
    req, found = ctx.request, []
    for w in workers:
        a, uma = ctx.allocatable[w.name], w.unified_memory
        gpus = sorted(((g, a.vram.get(g.index, 0)) for g in w.gpus), key=lambda x: -x[1])
        gpus = [x for x in gpus if x[1] >= req.layer_vram(uma)]
        if len(gpus) < 2 or _ram(req.full, uma) > a.ram:
            continue
        for n in range(2, len(gpus) + 1):
            cands = []
            equal = len({x[1] for x in gpus}) == 1
            tries = 1 if equal and not reports(w) else MAX_COMBINATIONS  # equal GPUs differ only by topology
            for comb in islice(gpu_sets.ordered(w, gpus, n, lambda x: x[0]), tries):
                allocs = [x[1] for x in comb]
                if sum(allocs) < _vram(req.full, 0, uma):
                    continue
                item = req.run(tuple(allocs), gpu_layers=gpu_layers)
                if _fits(item, allocs, a.ram, uma):
                    vram = {g.index: _vram(item, i, uma) for i, (g, _) in enumerate(comb)}
                    cands.append(Candidate(w.name, [g.index for g, _ in comb], claim(
                        ram=_ram(item, uma), vram=vram, offload_layers=item.offload_layers,
                        total_layers=req.total_layers, tensor_split=allocs, is_unified_memory=uma), gpu_type=comb[0][0].type))
            if cands:
                found.extend(gpu_sets.first_per_level(w, cands))
                break
    if not found:
        msgs.append("No worker's GPUs can together hold the whole model.")
        return []
    fewest = min(len(c.gpu_indexes) for c in found)
    return [c for c in found if len(c.gpu_indexes) == fewest]


def rpc(ctx: Context, workers, msgs, cpu_offloading: bool) -> list[Candidate]:
    """llama.cpp over RPC: a main worker's GPUs plus RPC servers on other workers' GPUs."""
    req, cfg = ctx.request, ctx.config
    layer = req.layer_vram(False)
    rpc_layer = req.run((1, 1), ("host:80",), gpu_layers=1).vrams[0].nonuma
    main_w, main_gpus, best = None, [], -1
    for w in workers:
        a = ctx.allocatable[w.name]
        gs = [(g, a.vram.get(g.index, 0)) for g in w.gpus if a.vram.get(g.index, 0) >= layer]
        if gs and sum(x[1] for x in gs) > best:
            main_w, main_gpus, best = w, gs, sum(x[1] for x in gs)
    if main_w is None:
        msgs.append(f"No GPU can hold one layer ({gib(layer)} GiB).")
        return []
    pool = sorted(((w, g, ctx.allocatable[w.name].vram.get(g.index, 0)) for w in workers if w is not main_w
                   for g in w.gpus if ctx.allocatable[w.name].vram.get(g.index, 0) >= rpc_layer), key=lambda r: -r[2])
    if not pool:
        msgs.append("No other worker has a GPU that can serve one layer over RPC.")
        return []
    if len(pool) > cfg.max_rpc_gpus:
        msgs.append(f"Too many candidate RPC servers ({len(pool)}, max {cfg.max_rpc_gpus}); skipping distributed deployment.")
        return []
    a_main, total = ctx.allocatable[main_w.name], req.total_layers
    best_cand = None
    for k in range(1, min(len(pool), cfg.max_rpc_servers) + 1):
        chosen = pool[:k]
        allocs = [r[2] for r in chosen] + [x[1] for x in main_gpus]
        if not cpu_offloading and sum(allocs) < _vram(req.full, 0, False):
            continue
        servers = tuple(f"{w.name}:{50052 + i}" for i, (w, _, _) in enumerate(chosen))
        layers = [total] if not cpu_offloading else range(total, 0, -1)
        for n in layers:
            item = req.run(tuple(allocs), servers, gpu_layers=-1 if n == total else n)
            if not _fits(item, allocs, a_main.ram, False):
                continue
            subs = [subordinate(w.name, [g.index], claim(vram={g.index: item.vrams[i].nonuma},
                                                         offload_layers=item.vrams[i].handle_layers, total_layers=total))
                    for i, (w, g, _) in enumerate(chosen)]
            vram = {g.index: item.vrams[k + i].nonuma for i, (g, _) in enumerate(main_gpus)}
            c = Candidate(main_w.name, [g.index for g, _ in main_gpus], claim(
                ram=item.ram.nonuma, vram=vram, offload_layers=item.offload_layers, total_layers=total,
                tensor_split=allocs), subs, gpu_type=main_gpus[0][0].type)
            if best_cand is None or c.claim.offload_layers > best_cand.claim.offload_layers:
                best_cand = c
            break
        if best_cand and best_cand.claim.offload_layers == total:
            break
    if best_cand is None or (not cpu_offloading and best_cand.claim.offload_layers != total):
        msgs.append("No combination of RPC servers can hold the model.")
        return []
    return [best_cand]


def partial(ctx: Context, workers, msgs) -> list[Candidate]:
    """Some layers on one GPU, the rest on the CPU: the most layers that fit, per worker."""
    req, out = ctx.request, []
    partials = req.items[1:-1]  # 1..N layers, not full
    if req.gpu_layers and 0 < req.gpu_layers < req.total_layers:
        partials = [req.items[req.gpu_layers]]  # the user fixed the count: that item or nothing
    for w in workers:
        a, uma = ctx.allocatable[w.name], w.unified_memory
        for g in w.gpus:
            alloc = a.vram.get(g.index, 0)
            keys = [_vram(i, 0, uma) for i in partials]
            n = bisect.bisect_right(keys, alloc)
            while n > 0 and not _ram_ok(_ram(partials[n - 1], uma), _vram(partials[n - 1], 0, uma), a.ram, uma):
                n -= 1
            if n > 0:
                item = partials[n - 1]
                out.append(Candidate(w.name, [g.index], claim(
                    ram=_ram(item, uma), vram={g.index: _vram(item, 0, uma)}, offload_layers=item.offload_layers,
                    total_layers=req.total_layers, is_unified_memory=uma), gpu_type=g.type))
    if not out:
        msgs.append("No GPU can hold even one layer beside the CPU's share.")
        return []
    most = max(c.claim.offload_layers for c in out)
    return [c for c in out if c.claim.offload_layers == most]


def cpu(ctx: Context, workers, msgs) -> list[Candidate]:
    req = ctx.request
    out = []
    for w in sorted(workers, key=lambda w: -ctx.allocatable[w.name].ram):
        r = _ram(req.cpu_only, w.unified_memory)
        if r <= ctx.allocatable[w.name].ram:
            out.append(Candidate(w.name, [], claim(ram=r, offload_layers=0, total_layers=req.total_layers,
                                                    is_unified_memory=w.unified_memory)))
    if not out:
        msgs.append(f"No worker has {gib(_ram(req.cpu_only, False))} GiB of allocatable RAM for a CPU-only run.")
    return out
