"""Whole-card-fraction strategies shared by vLLM and SGLang: an engine that takes a fixed share
of each card (vLLM's --gpu-memory-utilization, SGLang's --mem-fraction-static) books
``int(total * fraction)`` per GPU; with fraction 0 (non-LLM vLLM) it books the estimate."""

from __future__ import annotations

from scheduler.cluster import GPU, Worker
from scheduler.candidates import GpuRows
from scheduler.decision import Candidate, Context, claim, subordinate
from scheduler.selectors import gpu_sets
from scheduler.selectors.manual import manual
from scheduler.selectors.sizing import Shape, book_all
from scheduler.units import gib


def by_type(workers: list[Worker]) -> list[tuple[str, Worker, list[GPU]]]:
    """(gpu type, worker, its GPUs of that type): types in order of first appearance, then
    workers in order. A worker with GPUs of two vendors appears once per type with all of them."""
    order: dict[str, list[tuple[Worker, list[GPU]]]] = {}
    for w in workers:
        types: dict[str, list[GPU]] = {}
        for g in w.gpus:
            types.setdefault(g.type, []).append(g)
        for t, gpus in types.items():
            order.setdefault(t, []).append((w, gpus))
    return [(t, w, gpus) for t, pairs in order.items() for w, gpus in pairs]


def _book(ratio: float, g: GPU, alloc: int, fallback: int) -> int:
    return int(g.vram_total * ratio) if ratio > 0 else fallback


def single_gpu(ctx: Context, workers: list[Worker], shape: Shape, msgs: list[str]) -> list[Candidate]:
    if shape.gpu_count > 1:
        return []
    req, out, best = ctx.request, GpuRows(), (0, 0.0)
    for t, w, gpus in by_type(workers):
        a = ctx.allocatable[w.name]
        if req.ram > a.ram:
            continue
        for g in gpus:
            r, alloc = shape.ratio(w, g), a.vram.get(g.index, 0)
            rate = alloc / g.vram_total if g.vram_total else 0.0
            best = max(best, (alloc, rate))
            fits = (req.vram <= g.vram_total * r and rate >= r) if r > 0 else req.vram <= alloc
            if fits:
                out.add(w.name, g.index, _book(r, g, alloc, req.vram), req.ram, t, r or None)
    if not out:
        msgs.append(f"The current available GPU only has {gib(best[0])} GiB allocatable VRAM ({best[1] * 100:.2f}%).")
    return out


def _set_candidate(ctx: Context, shape: Shape, w: Worker, t: str, gpus: list[GPU]) -> Candidate | None:
    """Another set of as many GPUs on the same worker (gpu_sets.py), if it holds the model too."""
    a = ctx.allocatable[w.name]
    if sum(_book(shape.ratio(w, g), g, a.vram[g.index], a.vram[g.index]) for g in gpus) < ctx.request.vram:
        return None
    (vram,) = book_all(shape, ctx, [(w, gpus)], ctx.request.vram)
    r = shape.ratio(w, gpus[0])
    return Candidate(w.name, [g.index for g in gpus], claim(ram=ctx.request.ram, vram=vram, vram_utilization=r or None), gpu_type=t)


def multi_gpu(ctx: Context, workers: list[Worker], shape: Shape, msgs: list[str]) -> list[Candidate]:
    if shape.gpu_count == 1:
        return []
    req, found, largest = ctx.request, [], None
    tp_notes: list[str] = []
    for t, w, gpus in by_type(workers):
        a = ctx.allocatable[w.name]
        if len(gpus) < 2 or req.ram > a.ram:
            continue
        def ok(g):
            r, alloc = shape.ratio(w, g), a.vram.get(g.index, 0)
            rate = alloc / g.vram_total if g.vram_total else 0.0
            return (rate > r if shape.strict_multi_gpu else rate >= r) if r > 0 else alloc > 0
        usable = sorted((g for g in gpus if ok(g)), key=lambda g: -a.vram[g.index])
        total_alloc = sum(a.vram.get(g.index, 0) for g in gpus)
        if largest is None or total_alloc > largest[0]:
            largest = (total_alloc, len(usable), len(gpus), sum(_book(shape.ratio(w, g), g, a.vram[g.index], a.vram[g.index]) for g in usable))
        chosen, vram_sum = [], 0
        for g in usable:
            chosen.append(g)
            vram_sum += _book(shape.ratio(w, g), g, a.vram[g.index], a.vram[g.index])
            n = len(chosen)
            if n < 2:
                continue
            probs = shape.tp_problems(n)
            if probs:
                tp_notes = probs
                continue
            if shape.gpu_count and n < shape.gpu_count:
                continue
            if vram_sum >= req.vram:
                (vram,) = book_all(shape, ctx, [(w, chosen)], req.vram)
                r = shape.ratio(w, chosen[0])
                found.append(Candidate(w.name, [x.index for x in chosen], claim(ram=req.ram, vram=vram, vram_utilization=r or None), gpu_type=t))
                found.extend(gpu_sets.better(w, usable, chosen, lambda s: _set_candidate(ctx, shape, w, t, s)))
            if shape.gpu_count or vram_sum >= req.vram:
                break
    if not found:
        if largest:
            msgs.append(f"The largest available worker has {gib(largest[0])} GiB allocatable VRAM, {largest[1]}/{largest[2]} "
                        f"of GPUs meet the VRAM utilization ratio, providing {gib(largest[3])} GiB of allocatable VRAM.")
        msgs.extend(tp_notes)
        return []
    fewest = min(len(c.gpu_indexes) for c in found)
    return [c for c in found if len(c.gpu_indexes) == fewest]


def multi_worker(ctx: Context, workers: list[Worker], shape: Shape, msgs: list[str]) -> list[Candidate]:
    """Whole workers of equal GPU count, all GPUs free enough, until the fractions cover the
    claim. The first combination found is the one candidate; its first worker is the main."""
    if not ctx.spec.distributed:
        return []
    req = ctx.request
    buckets: dict[tuple[str, int], list[tuple[Worker, list[GPU]]]] = {}
    for t, w, gpus in sorted(by_type(workers), key=lambda x: -len(x[2])):
        buckets.setdefault((t, len(gpus)), []).append((w, gpus))
    for (t, count), members in buckets.items():
        if len(members) < 2 or shape.tp_problems(count):
            continue
        picked, gpu_sum, vram_sum = [], 0, 0
        for w, gpus in members:
            a = ctx.allocatable[w.name]
            if req.ram > a.ram:
                continue
            if any(shape.ratio(w, g) > 0 and a.vram.get(g.index, 0) / g.vram_total < shape.ratio(w, g) for g in gpus):
                continue
            if any(shape.ratio(w, g) == 0 and a.vram.get(g.index, 0) == 0 for g in gpus):
                continue
            picked.append((w, gpus))
            gpu_sum += len(gpus)
            vram_sum += sum(_book(shape.ratio(w, g), g, a.vram[g.index], a.vram[g.index]) for g in gpus)
            if shape.enforce_count_across_workers and shape.gpu_count:
                if gpu_sum < shape.gpu_count:
                    continue
                if gpu_sum > shape.gpu_count:
                    break
            if vram_sum >= req.vram and len(picked) >= 2:
                return [_distributed(ctx, t, picked, shape)]
    msgs.append("Cannot find a suitable worker combination to run the model in distributed mode.")
    return []


def _distributed(ctx: Context, t: str, picked, shape: Shape) -> Candidate:
    req = ctx.request
    books = book_all(shape, ctx, picked, req.vram)
    (mw, mg), rest = picked[0], picked[1:]
    subs = [subordinate(w.name, [g.index for g in gpus], claim(vram=b, vram_utilization=shape.ratio(w, gpus[0]) or None))
            for (w, gpus), b in zip(rest, books[1:])]
    main = claim(ram=req.ram, vram=books[0], vram_utilization=shape.ratio(mw, mg[0]) or None)
    return Candidate(mw.name, [g.index for g in mg], main, subs, gpu_type=t)


def strategies(ctx: Context, workers: list[Worker], shape: Shape):
    """vLLM's and SGLang's order: manual selection alone when GPUs are named; else one GPU,
    several GPUs on one worker, several workers."""
    if ctx.spec.gpu_selector.gpu_ids:
        return [("manual", lambda m: manual(ctx, workers, shape, m, allow_multi_worker=ctx.spec.distributed))]
    return [("single_gpu", lambda m: single_gpu(ctx, workers, shape, m)),
            ("multi_gpu", lambda m: multi_gpu(ctx, workers, shape, m)),
            ("multi_worker", lambda m: multi_worker(ctx, workers, shape, m))]
