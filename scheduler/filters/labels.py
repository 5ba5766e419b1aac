"""Keep workers whose labels match every key=value of worker_selector (exact match)."""

from scheduler.filters.chain import verdict

NAME = "labels"


def run(ctx, workers):
    sel = ctx.spec.worker_selector
    removed = {}
    for w in workers:
        bad = [f"label {k}={v!r} wanted, worker has {w.labels[k]!r}" if k in w.labels else f"label {k} wanted, worker has none"
               for k, v in sel.items() if w.labels.get(k) != v]
        if bad:
            removed[w.name] = bad
    note = f"Matched {len(workers) - len(removed)}/{len(workers)} workers by label selector: {sel}." if removed else None
    return verdict(NAME, workers, removed, note)
