"""Keep the workers named in gpu_selector.gpu_ids (when any are given); name selected workers
that are missing and selected GPUs a worker does not have."""

from scheduler.filters.chain import verdict

NAME = "gpu_selector"


def run(ctx, workers):
    wanted = ctx.spec.gpu_selector.by_worker()
    if not wanted:
        return verdict(NAME, workers, {})
    removed = {}
    for w in workers:
        ids = wanted.get(w.name)
        if ids is None:
            removed[w.name] = [f"no GPU of this worker is in gpu_selector.gpu_ids ({', '.join(ctx.spec.gpu_selector.gpu_ids)})"]
            continue
        reasons = []
        for g in ids:
            gpu = w.gpu(g.index)
            if gpu is None:
                reasons.append(f"selected GPU {w.name}:{g.type}:{g.index} does not exist (worker has indexes {[x.index for x in w.gpus]})")
            elif gpu.type != g.type:
                reasons.append(f"selected GPU {w.name}:{g.type}:{g.index} is of type {gpu.type!r}, not {g.type!r}")
        if reasons:
            removed[w.name] = reasons
    present = {w.name for w in workers}
    missing = sorted(set(wanted) - present)
    n = len(workers) - len(removed)
    note = f"Matched {n} worker(s) by gpu selector." + (f" Missing workers: {', '.join(missing)}." if missing else "")
    return verdict(NAME, workers, removed, note)
