"""Custom and VoxBox backends: manual (one worker); one GPU; several GPUs on one worker; CPU.

A declared whole-card fraction (--gpu-memory-utilization / --mem-fraction-static in the run
command or parameters) books max(estimate share, total * fraction) per GPU. Unlike GPUStack,
the multi-GPU path takes the fewest GPUs that can each hold their share, never a full GPU, and
it is offered only to an engine that declares it splits a replica over GPUs (``splits``): a
custom run_command that takes ``{gpu_indexes}``, ``gpu_selector.gpus_per_replica`` above 1, or
a tensor- or pipeline-parallel size above 1 in the command or its parameters. Any other engine is taken to run on one GPU (VoxBox always: GPUStack gives it one GPU a replica);
a replica split over GPUs it never uses would leave part of its model nowhere.
"""

from __future__ import annotations

import shlex

from scheduler.candidates import GpuRows
from scheduler.decision import Candidate, Context, claim
from scheduler.params import whole_card_fraction
from scheduler.selectors import gpu_sets
from scheduler.selectors.base import first_nonempty
from scheduler.selectors.fraction import by_type
from scheduler.selectors.manual import manual
from scheduler.selectors.sizing import Shape, split
from scheduler.spec import Backend
from scheduler.units import gib


def _per_card(req_vram: int, frac: float | None, total: int, share: int) -> int:
    return max(share, int(total * frac)) if frac else share


def single_gpu(ctx: Context, workers, frac, msgs) -> list[Candidate]:
    """Every GPU that holds the claim, walked as GPUStack walks them (workers grouped by GPU type,
    types in order of first appearance), so equal scores go to the same first candidate."""
    req, out, best = ctx.request, GpuRows(), 0
    ram, vram, allocatable = req.ram, req.vram, ctx.allocatable
    names, indexes, books, types = [], [], [], []  # the rows' columns (GpuRows.extend)
    for t, w, gpus in by_type(workers):
        a = allocatable[w.name]
        if ram > a.ram:
            continue
        free, name = a.vram, w.name
        for g in gpus:
            i = g.index
            alloc = free.get(i, 0)
            if alloc > best:
                best = alloc
            need = _per_card(vram, frac, g.vram_total, vram) if frac else vram
            if need <= alloc:
                names.append(name)
                indexes.append(i)
                books.append(need)
                types.append(t)
    out.extend(names, indexes, books, types, ram)
    if not out:
        msgs.append(f"The largest allocatable GPU has {gib(best)} GiB; the model needs {gib(req.vram)} GiB on one GPU.")
    return out


def _set_candidate(ctx: Context, w, frac, gpus) -> Candidate | None:
    """Another set of as many GPUs on the same worker (gpu_sets.py), if each can hold its share."""
    req, a = ctx.request, ctx.allocatable[w.name]
    allocs = [a.vram.get(g.index, 0) for g in gpus]
    if sum(allocs) < req.vram:
        return None
    shares = split(req.vram, allocs) if not frac else [req.vram // len(gpus)] * len(gpus)
    vram = {g.index: _per_card(req.vram, frac, g.vram_total, s) for g, s in zip(gpus, shares)}
    if any(vram[g.index] > al for g, al in zip(gpus, allocs)):
        return None
    return Candidate(w.name, [g.index for g in gpus], claim(ram=req.ram, vram=vram), gpu_type=gpus[0].type)


PARALLEL_FLAGS = ("--tensor-parallel-size", "-tp", "--tp-size", "--tp", "--pipeline-parallel-size", "-pp", "--pp-size")


def splits(spec) -> bool:
    """The engine can hold one replica on several GPUs: a custom run_command that takes
    ``{gpu_indexes}``, ``gpu_selector.gpus_per_replica`` above 1, or a parallel size above 1
    (PARALLEL_FLAGS, ``--k v`` or ``--k=v``) in the command or backend_parameters."""
    if spec.backend != Backend.CUSTOM:
        return False
    if "{gpu_indexes}" in (spec.run_command or "") or (spec.gpu_selector.gpus_per_replica or 1) > 1:
        return True
    try:
        words = shlex.split(spec.run_command or "") + list(spec.backend_parameters)
    except ValueError:
        words = list(spec.backend_parameters)
    words = [x for w in words for x in (w.split("=", 1) if w.startswith("-") and "=" in w else [w])]
    return any(w in PARALLEL_FLAGS and k + 1 < len(words) and words[k + 1].isdigit() and int(words[k + 1]) > 1
               for k, w in enumerate(words))


def multi_gpu(ctx: Context, workers, frac, msgs) -> list[Candidate]:
    if not splits(ctx.spec):
        msgs.append("VoxBox runs a replica on one GPU." if ctx.spec.backend != Backend.CUSTOM else
                    "The engine is taken to run on one GPU: its run_command does not take {gpu_indexes} and "
                    "gpu_selector.gpus_per_replica is not above 1, nor is a tensor- or pipeline-parallel size (any of "
                    "these declares that it splits a replica over GPUs).")
        return []
    req, out = ctx.request, []
    for w in workers:
        a = ctx.allocatable[w.name]
        if len(w.gpus) < 2 or req.ram > a.ram:
            continue
        gpus = sorted(w.gpus, key=lambda g: -a.vram.get(g.index, 0))
        for n in range(2, len(gpus) + 1):
            top = gpus[:n]
            allocs = [a.vram.get(g.index, 0) for g in top]
            if sum(allocs) < req.vram:
                continue
            shares = split(req.vram, allocs) if not frac else [req.vram // n] * n
            vram = {g.index: _per_card(req.vram, frac, g.vram_total, s) for g, s in zip(top, shares)}
            if all(vram[g.index] <= al for g, al in zip(top, allocs)):
                out.append(Candidate(w.name, [g.index for g in top], claim(ram=req.ram, vram=vram), gpu_type=top[0].type))
                out.extend(gpu_sets.better(w, gpus, top, lambda s: _set_candidate(ctx, w, frac, s)))
                break
    if not out:
        msgs.append(f"No worker's GPUs can together hold {gib(req.vram)} GiB with each GPU holding its share.")
    return out


def cpu(ctx: Context, workers, msgs) -> list[Candidate]:
    if not ctx.spec.offloads_to_cpu:
        if any(not w.gpus for w in workers):
            msgs.append(f"Workers without a GPU ({', '.join(w.name for w in workers if not w.gpus)}) could run it "
                        "on the CPU, but cpu_offloading is off.")
        return []
    req = ctx.request
    out = [Candidate(w.name, [], claim(ram=req.ram)) for w in workers if req.ram <= ctx.allocatable[w.name].ram]
    if not out:
        msgs.append(f"No worker has {gib(req.ram)} GiB of allocatable RAM.")
    return out


def select(ctx: Context, workers, msgs: list[str]):
    spec, req = ctx.spec, ctx.request
    frac = whole_card_fraction(spec.run_command, spec.backend_parameters)
    msgs.append(f"The model requires approximately {gib(req.vram)} GiB of VRAM and {gib(req.ram)} GiB of RAM ({req.basis}).")
    if spec.gpu_selector.gpu_ids:
        if len(spec.gpu_selector.by_worker()) > 1:
            msgs.append("Manual GPU selection across multiple workers is not supported for custom backends.")
            return None, []
        shape = Shape(ratio=lambda w, g: 0.0, strict_multi_gpu=False, gpu_count=0,
                      enforce_count_across_workers=False, tp_problems=lambda n: [])
        return first_nonempty([("manual", lambda m: manual(ctx, workers, shape, m, allow_multi_worker=False))], msgs)
    return first_nonempty([("single_gpu", lambda m: single_gpu(ctx, workers, frac, m)),
                           ("multi_gpu", lambda m: multi_gpu(ctx, workers, frac, m)),
                           ("cpu", lambda m: cpu(ctx, workers, m))], msgs)
