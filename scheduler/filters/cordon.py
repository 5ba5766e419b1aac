"""Drop cordoned workers: an operator said no new replicas go there (``gpuflow hosts cordon``; the
host workflow's ``cordon`` update). Replicas already placed there keep their bookings: the filter
only runs when a replica is placed, and the ledger refuses a new booking there too (store/ledger.py).

Kubernetes' ``NodeUnschedulable`` plugin, in GPUStack's order just after the status filter (a
cordoned host is READY; it is the operator, not the host, that keeps it out). The chain runs it
only when some worker of the snapshot is cordoned (``applies``), as the fragmentation scorer runs
only when it can matter: a cluster without a cordon decides, and records, exactly what it did
before cordons existed, so decisions kept then replay the same."""

from scheduler.filters.chain import verdict

NAME = "cordon"
NAMED = 3  # hosts named in the summary line; the rest counted


def applies(ctx) -> bool:
    return any(w.cordoned for w in ctx.snapshot.workers)


def run(ctx, workers):
    removed = {w.name: [f"no new replicas here until 'gpuflow hosts uncordon {w.name}'"]
               for w in workers if w.cordoned}
    note = None
    if removed:
        names = list(removed)
        more = f" (+{len(names) - NAMED} more)" if len(names) > NAMED else ""
        note = (f"host {names[0]} is cordoned." if len(names) == 1
                else f"hosts {', '.join(names[:NAMED])}{more} are cordoned.")
    return verdict(NAME, workers, removed, note)
