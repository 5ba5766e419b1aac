"""GGUF (llama.cpp) placement strategies, each costed with llama.cpp's memory model.

Claims use the worker's memory kind: unified-memory (UMA) figures on Apple-style workers,
discrete (NonUMA) elsewhere. The RPC strategy is in gguf_rpc.py, partial offload in
gguf_partial.py. Departure from GPUStack, on purpose (docs/gpustack-differences.md): the
single-GPU scan skips a worker short of RAM instead of stopping altogether.
"""

from __future__ import annotations

from itertools import combinations, islice

from scheduler.candidates import GpuRows
from scheduler.decision import Candidate, Context, claim
from scheduler.gguf.estimate import EstimateItem
from scheduler.interconnect import reports
from scheduler.selectors import gpu_sets
from scheduler.units import gib

MAX_COMBINATIONS = 32  # tensor-split runs tried per GPU count on one worker


def item_vram(item: EstimateItem, i: int, uma: bool) -> int:
    return item.vrams[i].uma if uma else item.vrams[i].nonuma


def item_ram(item: EstimateItem, uma: bool) -> int:
    return item.ram.uma if uma else item.ram.nonuma


def _ram_ok(ram_claim: int, vram_claim: int, alloc_ram: int, uma: bool) -> bool:
    return ram_claim <= (alloc_ram - vram_claim if uma else alloc_ram)


def gpu_list(ctx: Context, workers) -> list[tuple]:
    """(worker, gpu, allocatable) for every GPU with room, largest first (stable)."""
    rows = [(w, g, ctx.allocatable[w.name].vram.get(g.index, 0)) for w in workers for g in w.gpus]
    return sorted((r for r in rows if r[2] > 0), key=lambda r: -r[2])


def single_gpu(ctx: Context, workers, msgs) -> list[Candidate]:
    req = ctx.request
    full, total = req.full, req.total_layers
    out = GpuRows(layers=total)
    need = {uma: (item_vram(full, 0, uma), item_ram(full, uma)) for uma in (False, True)}
    for w, g, alloc in gpu_list(ctx, workers):
        uma = w.unified_memory
        v, r = need[uma]
        if v > alloc or not _ram_ok(r, v, ctx.allocatable[w.name].ram, uma):
            continue
        out.add(w.name, g.index, v, r, g.type, None, uma)
    if not out:
        msgs.append(f"No GPU can hold the whole model: it needs {gib(need[False][0])} GiB of VRAM "
                    f"and {gib(need[False][1])} GiB of RAM.")
    return out


def _fits(item: EstimateItem, allocs: list[int], alloc_ram: int, uma: bool, offset: int = 0) -> bool:
    if not _ram_ok(item_ram(item, uma), 0, alloc_ram, uma):
        return False
    return all(item_vram(item, offset + i, uma) <= a for i, a in enumerate(allocs))


def multi_gpu(ctx: Context, workers, msgs, gpu_layers: int = -1) -> list[Candidate]:
    """Full offload over several GPUs of one worker, with a tensor split of their allocatable."""
    req, found = ctx.request, []
    for w in workers:
        a, uma = ctx.allocatable[w.name], w.unified_memory
        gpus = sorted(((g, a.vram.get(g.index, 0)) for g in w.gpus), key=lambda x: -x[1])
        gpus = [x for x in gpus if x[1] >= req.layer_vram(uma)]
        if len(gpus) < 2 or item_ram(req.full, uma) > a.ram:
            continue
        for n in range(2, len(gpus) + 1):
            cands = []
            equal = len({x[1] for x in gpus}) == 1
            tries = 1 if equal and not reports(w) else MAX_COMBINATIONS  # equal GPUs differ only by topology
            for comb in islice(gpu_sets.ordered(w, gpus, n, lambda x: x[0]), tries):
                allocs = [x[1] for x in comb]
                if sum(allocs) < item_vram(req.full, 0, uma):
                    continue
                item = req.run(tuple(allocs), gpu_layers=gpu_layers)
                if _fits(item, allocs, a.ram, uma):
                    vram = {g.index: item_vram(item, i, uma) for i, (g, _) in enumerate(comb)}
                    cands.append(Candidate(w.name, [g.index for g, _ in comb], claim(
                        ram=item_ram(item, uma), vram=vram, offload_layers=item.offload_layers,
                        total_layers=req.total_layers, tensor_split=allocs, is_unified_memory=uma), gpu_type=comb[0][0].type))
            if cands:
                found.extend(gpu_sets.first_per_level(w, cands))
                break
    if not found:
        msgs.append("No worker's GPUs can together hold the whole model.")
        return []
    fewest = min(len(c.gpu_indexes) for c in found)
    return [c for c in found if len(c.gpu_indexes) == fewest]


def cpu(ctx: Context, workers, msgs) -> list[Candidate]:
    req = ctx.request
    out = []
    for w in sorted(workers, key=lambda w: -ctx.allocatable[w.name].ram):
        r = item_ram(req.cpu_only, w.unified_memory)
        if r <= ctx.allocatable[w.name].ram:
            out.append(Candidate(w.name, [], claim(ram=r, offload_layers=0, total_layers=req.total_layers,
                                                    is_unified_memory=w.unified_memory)))
    if not out:
        msgs.append(f"No worker has {gib(item_ram(req.cpu_only, False))} GiB of allocatable RAM for a CPU-only run.")
    return out
