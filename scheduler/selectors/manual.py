"""Manual GPU selection (gpu_selector.gpu_ids): place on exactly the GPUs the user named.
Unlike GPUStack, a selection that does not fit is refused with the numbers, never overcommitted."""

from __future__ import annotations

from scheduler.decision import Candidate, Context, claim, subordinate
from scheduler.selectors import gpu_sets
from scheduler.selectors.sizing import Shape, book_all
from scheduler.units import gib


def _rate(ctx, w, g) -> float:
    return ctx.allocatable[w.name].vram.get(g.index, 0) / g.vram_total if g.vram_total else 0.0


def _problems(ctx: Context, shape: Shape, groups, books) -> list[str]:
    out, total = [], 0
    for (w, gpus), b in zip(groups, books):
        a = ctx.allocatable[w.name]
        for g in gpus:
            alloc, r = a.vram.get(g.index, 0), shape.ratio(w, g)
            total += b[g.index]
            if r > 0 and alloc / g.vram_total < r:
                out.append(f"Selected GPU {w.name}:{g.type}:{g.index} has {gib(alloc)} GiB allocatable "
                           f"({alloc / g.vram_total:.0%}), below the {r:.0%} of its {gib(g.vram_total)} GiB the engine takes.")
            elif b[g.index] > alloc:
                out.append(f"Selected GPU {w.name}:{g.type}:{g.index} has {gib(alloc)} GiB allocatable, needs {gib(b[g.index])} GiB.")
    if total < ctx.request.vram:
        out.append(f"Selected GPUs provide {gib(total)} GiB, the model needs {gib(ctx.request.vram)} GiB.")
    if ctx.request.ram > ctx.allocatable[groups[0][0].name].ram:
        out.append(f"Worker {groups[0][0].name} has {gib(ctx.allocatable[groups[0][0].name].ram)} GiB allocatable RAM, needs {gib(ctx.request.ram)} GiB.")
    return out


def manual(ctx: Context, workers, shape: Shape, msgs: list[str], allow_multi_worker: bool) -> list[Candidate]:
    sel = ctx.spec.gpu_selector
    by_worker = sel.by_worker()
    types = {g.type for ids in by_worker.values() for g in ids}
    n = shape.gpu_count or sel.gpus_per_replica or len(sel.gpu_ids)
    if len(types) > 1 and n == len(sel.gpu_ids):
        msgs.append(f"Deployment with heterogeneous GPU types is not supported (selected types: {', '.join(sorted(types))}).")
        return []
    groups = []
    for w in workers:
        if w.name in by_worker:
            gpus = [w.gpu(g.index) for g in by_worker[w.name]]
            groups.append((w, sorted(gpus, key=lambda g: -_rate(ctx, w, g))))
    groups.sort(key=lambda x: -len(x[1]))
    if not groups:
        return []
    options = []
    if n == 1:
        options = [[(w, [g])] for w, gpus in groups for g in gpus]
    else:
        options = [[(w, gpus[:n])] for w, gpus in groups if len(gpus) >= n]
        options += [[(w, s)] for w, gpus in groups if len(gpus) > n for s in gpu_sets.better(w, gpus, gpus[:n], list)]
        if not options and allow_multi_worker and len(groups) > 1:
            picked, left = [], n
            for w, gpus in groups:
                if left <= 0:
                    break
                take = gpus[:left]
                picked.append((w, take))
                left -= len(take)
            if left <= 0:
                options = [picked]
        elif not options:
            msgs.append(f"No selected worker has {n} selected GPUs; across workers is not allowed for this backend.")
    out, problems = [], []
    for groups_ in options:
        books = book_all(shape, ctx, groups_, ctx.request.vram)
        p = _problems(ctx, shape, groups_, books)
        if p:
            problems.extend(p)
            continue
        (mw, mg), rest = groups_[0], groups_[1:]
        subs = [subordinate(w.name, [g.index for g in gs], claim(vram=b)) for (w, gs), b in zip(rest, books[1:])]
        r = shape.ratio(mw, mg[0]) or None
        out.append(Candidate(mw.name, [g.index for g in mg], claim(ram=ctx.request.ram, vram=books[0], vram_utilization=r),
                             subs, gpu_type=mg[0].type))
    if not out:
        msgs.extend(dict.fromkeys(problems))
    return out
