"""Windowed values from Prometheus histograms: the bucket deltas between two scrapes, never the
cumulative sums or means since the engine started (the mistake in aibrix#852).

A histogram is its cumulative buckets ``(le, count)`` in ascending ``le`` (the last is +Inf), with
its ``sum`` and ``count``. ``delta`` subtracts the previous scrape bucket by bucket; a counter that
went down means the engine restarted, and the window then holds the new scrape alone (counting
from zero since the restart), as Prometheus' ``increase()`` treats a reset. ``quantile`` is
``histogram_quantile``: find the bucket holding rank q * count and interpolate linearly inside it;
a rank in the +Inf bucket gives the highest finite bound."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Histogram:
    buckets: tuple[tuple[float, float], ...]  # (le, cumulative count), ascending le, last +Inf
    count: float = 0.0
    sum: float = 0.0

    @staticmethod
    def of(buckets: dict[float, float], count: float | None = None, total: float = 0.0) -> "Histogram":
        b = tuple(sorted((float(le), float(n)) for le, n in buckets.items()))
        if not b or not math.isinf(b[-1][0]):
            b = b + ((math.inf, float(count if count is not None else (b[-1][1] if b else 0.0))),)
        return Histogram(buckets=b, count=float(count if count is not None else b[-1][1]), sum=float(total))


EMPTY = Histogram(buckets=((math.inf, 0.0),))


def _reset(prev: Histogram, cur: Histogram) -> bool:
    if cur.count < prev.count or cur.sum < prev.sum:
        return True
    before = dict(prev.buckets)
    return any(n < before.get(le, 0.0) for le, n in cur.buckets)


def delta(prev: Histogram | None, cur: Histogram) -> Histogram:
    """What was observed between the scrapes ``prev`` and ``cur`` (``cur`` alone after a reset)."""
    if prev is None or _reset(prev, cur):
        return cur
    before = dict(prev.buckets)
    return Histogram(buckets=tuple((le, n - before.get(le, 0.0)) for le, n in cur.buckets),
                     count=cur.count - prev.count, sum=cur.sum - prev.sum)


def merge(hs: list[Histogram]) -> Histogram:
    """Several replicas' windows as one. Bounds that differ are merged on their union: each
    histogram contributes, at bound b, its cumulative count at its own largest bound <= b."""
    hs = [h for h in hs if h.count > 0]
    if not hs:
        return EMPTY
    bounds = sorted({le for h in hs for le, _ in h.buckets})

    def at(h: Histogram, b: float) -> float:
        n = 0.0
        for le, c in h.buckets:
            if le > b:
                break
            n = c
        return n

    return Histogram(buckets=tuple((b, sum(at(h, b) for h in hs)) for b in bounds),
                     count=sum(h.count for h in hs), sum=sum(h.sum for h in hs))


def quantile(h: Histogram, q: float) -> float | None:
    """The q-quantile (0 < q < 1) of what ``h`` observed, or None when it observed nothing."""
    if h.count <= 0:
        return None
    rank = q * h.count
    lower, below = 0.0, 0.0
    for le, n in h.buckets:
        if n >= rank:
            if math.isinf(le):
                return lower
            if n == below:
                return le
            return lower + (le - lower) * (rank - below) / (n - below)
        lower, below = le, n
    return lower


def mean(h: Histogram) -> float | None:
    return h.sum / h.count if h.count > 0 else None
