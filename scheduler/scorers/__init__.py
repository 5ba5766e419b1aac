"""Scorers return 0..100 per candidate (or instance); the chain applies weight/100 and sums.
Scale-up: placement (binpack or spread) and model-file locality. Scale-down: status,
offloaded layers, placement in removal mode."""

from __future__ import annotations

from typing import Callable, Sequence

from scheduler.candidates import GpuRows

Scorer = tuple[str, float, Callable[[Sequence], list[float]]]  # (name, weight, score function)


def apply_chain(items: Sequence, chain: list[Scorer]) -> None:
    """Set ``.scores[name]`` (the weighted contribution) and ``.score`` (their sum) on each item."""
    names, columns = [], []
    for name, weight, fn in chain:
        if weight <= 0:
            continue
        raw = fn(items)
        total = sum(raw)  # NaN if any is (min and max may step over one)
        if raw and (total != total or not 0.0 <= min(raw) or not max(raw) <= 100.0 + 1e-9):
            bad = next(s for s in raw if not 0.0 <= s <= 100.0 + 1e-9)
            raise ValueError(f"scorer {name} returned {bad}, outside 0..100")
        names.append(name)
        columns.append([s * weight / 100.0 for s in raw])
    if isinstance(items, GpuRows):  # the rows keep the columns; a candidate built later takes its row
        items.set_scores(names, columns, _totals(columns, len(items)))
        return
    for it, row in zip(items, zip(*columns)) if columns else ((it, ()) for it in items):
        it.scores = dict(zip(names, row))
        it.score = _total(row)


def _totals(columns: list[list[float]], n: int) -> list[float]:
    """_total of each row, without a call per row for one or two scorers (the same additions)."""
    if not columns:
        return [0.0] * n
    if len(columns) == 1:
        return [0.0 + a for a in columns[0]]
    if len(columns) == 2:
        return [0.0 + a + b for a, b in zip(*columns)]
    return [_total(row) for row in zip(*columns)]


def _total(row) -> float:
    total = 0.0
    for v in row:  # summed in the chain's order
        total += v
    return total


def pick(items: Sequence):
    """Highest score; ties go to the first in order (strictly greater replaces)."""
    if isinstance(items, GpuRows):
        k = items.best()
        return None if k is None else items[k]
    best = None
    for it in items:
        if best is None or it.score > best.score:
            best = it
    return best
