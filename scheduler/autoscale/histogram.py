"""Windowed values from Prometheus histograms: the bucket deltas between two scrapes, never the
cumulative sums or means since the engine started (the mistake in aibrix#852).

A histogram is its cumulative buckets ``(le, count)`` in ascending ``le`` (the last is +Inf), with
its ``sum`` and ``count``. ``delta`` subtracts the previous scrape bucket by bucket; a counter that
went down means the engine restarted, and the window then holds the new scrape alone (counting
from zero since the restart), as Prometheus' ``increase()`` treats a reset.

``quantile`` is Prometheus' ``histogram_quantile`` (promql/quantile.go ``bucketQuantile``):
cumulative counts that go down are raised to the running maximum (``ensureMonotonic``); rank =
q x count; the first bucket whose cumulative count reaches the rank holds the quantile, which is
interpolated linearly between the bucket's bounds (the lowest bucket starts at 0, unless its upper
bound is <= 0, which is then returned); a rank in the +Inf bucket gives the highest finite bound;
fewer than two buckets (no finite bound) or no observation gives None (Prometheus' NaN). A bucket
interpolates as if its observations were spread evenly: one 0.105 s request in (0.1, 0.25] reads
as a P95 of 0.1 + 0.15 x 0.95 = 242 ms, in Prometheus too. Thresholds set at bucket bounds are
judged by the counts alone."""

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
    """The q-quantile (0 <= q <= 1) of what ``h`` observed, as ``histogram_quantile``; None when it
    observed nothing or has no finite bound."""
    if h.count <= 0 or len(h.buckets) < 2 or not math.isinf(h.buckets[-1][0]):
        return None
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    cum, top = [], 0.0
    for le, n in h.buckets:  # ensureMonotonic
        top = max(top, n)
        cum.append((le, top))
    total = cum[-1][1]
    if total <= 0:
        return None
    rank = q * total
    b = next(i for i, (_, n) in enumerate(cum) if n >= rank)
    if b == len(cum) - 1:
        return cum[-2][0]
    if b == 0 and cum[0][0] <= 0:
        return cum[0][0]
    start, below = (cum[b - 1][0], cum[b - 1][1]) if b > 0 else (0.0, 0.0)
    end, n = cum[b]
    return start + (end - start) * ((rank - below) / (n - below)) if n > below else end


def sparse(h: Histogram) -> Histogram:
    """``h`` without the bounds no observation needs: a bound is kept when its bucket holds
    observations or the next one does (it is then that bucket's lower bound), and +Inf always.
    ``quantile`` and ``merge`` give the same answers; a window carried between steps stays small."""
    keep, prev = [], 0.0
    for i, (le, n) in enumerate(h.buckets):
        nxt = h.buckets[i + 1][1] if i + 1 < len(h.buckets) else n
        if n != prev or nxt != n or math.isinf(le):
            keep.append((le, n))
        prev = n
    return Histogram(buckets=tuple(keep), count=h.count, sum=h.sum)


def mean(h: Histogram) -> float | None:
    return h.sum / h.count if h.count > 0 else None
