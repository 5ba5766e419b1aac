"""Keep workers of the model's cluster."""

from scheduler.filters.chain import verdict

NAME = "cluster"


def run(ctx, workers):
    want = ctx.spec.cluster
    removed = {w.name: [f"worker is in cluster {w.cluster!r}, the model asks for {want!r}"]
               for w in workers if w.cluster != want}
    n = len(workers) - len(removed)
    return verdict(NAME, workers, removed, f"Matched {n} worker{'s' if n != 1 else ''} by cluster selector.")
