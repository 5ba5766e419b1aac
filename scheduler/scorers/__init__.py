"""Scorers return 0..100 per candidate (or instance); the chain applies weight/100 and sums.
Scale-up: placement (binpack or spread) and model-file locality. Scale-down: status,
offloaded layers, placement in removal mode."""

from __future__ import annotations

from typing import Callable, Sequence

Scorer = tuple[str, float, Callable[[Sequence], list[float]]]  # (name, weight, score function)


def apply_chain(items: Sequence, chain: list[Scorer]) -> None:
    """Set ``.scores[name]`` (the weighted contribution) and ``.score`` (their sum) on each item."""
    for it in items:
        it.scores = {}
        it.score = 0.0
    for name, weight, fn in chain:
        if weight <= 0:
            continue
        raw = fn(items)
        for it, s in zip(items, raw):
            if not 0.0 <= s <= 100.0 + 1e-9:
                raise ValueError(f"scorer {name} returned {s}, outside 0..100")
            it.scores[name] = s * weight / 100.0
            it.score += it.scores[name]


def pick(items: Sequence):
    """Highest score; ties go to the first in order (strictly greater replaces)."""
    best = None
    for it in items:
        if best is None or it.score > best.score:
            best = it
    return best
