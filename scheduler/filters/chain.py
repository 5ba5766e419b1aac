"""The filter chain: run filters in order (those that apply), stop at the first that leaves no worker."""

from __future__ import annotations

from scheduler.cluster import Worker
from scheduler.decision import Context, FilterVerdict


def verdict(name: str, workers: list[Worker], removed: dict[str, list[str]], note: str | None = None) -> tuple[list[Worker], FilterVerdict]:
    kept = [w for w in workers if w.name not in removed]
    return kept, FilterVerdict(name, len(workers), [w.name for w in kept], removed, note)


def run_chain(ctx: Context, workers: list[Worker], chain) -> tuple[list[Worker], list[FilterVerdict]]:
    verdicts = []
    for f in chain:
        if not getattr(f, "applies", lambda _: True)(ctx):
            continue
        workers, v = f.run(ctx, workers)
        verdicts.append(v)
        if not workers:
            break
    return workers, verdicts
