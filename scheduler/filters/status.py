"""Keep READY workers only."""

from scheduler.cluster import WorkerState
from scheduler.filters.chain import verdict

NAME = "status"


def run(ctx, workers):
    removed = {w.name: [f"worker state is {w.state.value}, not ready"] for w in workers if w.state != WorkerState.READY}
    note = f"Matched {len(workers) - len(removed)}/{len(workers)} workers by READY status." if removed else None
    return verdict(NAME, workers, removed, note)
