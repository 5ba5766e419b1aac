"""VPA's decaying histogram of memory peaks (kubernetes/autoscaler, recommender/util/
decaying_histogram.go and histogram_options.go), over bytes.

Buckets are exponential: bucket n starts at FIRST * (RATIO**n - 1) / (RATIO - 1), so the first
is FIRST (10 MB) wide and each is 5% wider than the one before (VPA's memory histogram: first
bucket 1e7 bytes, ratio 1.05). Up to MAX_BYTES that is 206 buckets, so a fingerprint's state is
bounded whatever its history (kept sparse: only buckets with weight).

A sample taken at ``t`` weighs 2 ** ((t - ref) / half_life): newer samples weigh more, so every
older one's share halves each half-life, and a percentile (a ratio of weights) is the same
whatever ``ref`` is. When the exponent passes RESCALE_AT the weights are divided by it and ``ref``
moves to ``t`` (VPA shifts its reference the same way), and buckets left under MIN_WEIGHT (a
sample about 20 half-lives old) are dropped. A percentile is the END of the bucket where the
cumulative weight reaches it, as VPA's (so it errs up, by at most a bucket's 5%)."""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

FIRST = 10_000_000  # bytes: VPA's first memory bucket
RATIO = 1.05  # VPA's: each bucket 5% wider than the one before
MAX_BYTES = 2**42  # 4 TiB: above any replica's VRAM (8 x 192 GiB is 1.5 TiB)
RESCALE_AT = 20.0  # half-lives past ``ref`` before the weights are rescaled to a new ref
MIN_WEIGHT = 1e-6  # a bucket lighter than this (after a rescale) is dropped


def bucket_of(value: int) -> int:
    """The bucket holding ``value`` bytes (0 for anything below FIRST)."""
    v = min(max(value, 0), MAX_BYTES)
    n = int(math.floor(math.log(1 + v * (RATIO - 1) / FIRST) / math.log(RATIO)))
    while bucket_start(n + 1) <= v:  # float rounding at a boundary
        n += 1
    while n > 0 and bucket_start(n) > v:
        n -= 1
    return n


def bucket_start(n: int) -> int:
    return int(round(FIRST * (RATIO**n - 1) / (RATIO - 1)))


def bucket_end(n: int) -> int:
    return bucket_start(n + 1)


MAX_BUCKETS = bucket_of(MAX_BYTES) + 1


class Histogram(BaseModel):
    """Weights per bucket (the bucket's number, as a string: JSON keys), relative to ``ref_s``."""

    ref_s: float = 0.0
    weights: dict[str, float] = Field(default_factory=dict, max_length=MAX_BUCKETS)

    def total(self) -> float:
        return sum(self.weights.values())

    def total_at(self, now: float, half_life_s: float) -> float:
        """The total weight as seen from ``now``: 1.0 is one sample taken at ``now``."""
        return self.total() * 2.0 ** (-(now - self.ref_s) / half_life_s)


def add(h: Histogram, value: int, at: float, half_life_s: float, weight: float = 1.0) -> Histogram:
    """``h`` with one more sample of ``value`` bytes taken at ``at`` (a new Histogram)."""
    ref, weights = h.ref_s, dict(h.weights)
    if not weights:
        ref = at
    exponent = (at - ref) / half_life_s
    if exponent > RESCALE_AT:
        scale = 2.0 ** -exponent
        weights = {k: w * scale for k, w in weights.items() if w * scale >= MIN_WEIGHT}
        ref, exponent = at, 0.0
    key = str(bucket_of(value))
    weights[key] = weights.get(key, 0.0) + weight * 2.0**exponent
    return Histogram(ref_s=ref, weights=weights)


def percentile(h: Histogram, p: float) -> int | None:
    """The smallest bucket end below which a share ``p`` of the weight lies; None when empty."""
    total = h.total()
    if total <= 0:
        return None
    seen = 0.0
    buckets = sorted(int(k) for k in h.weights)
    for n in buckets:
        seen += h.weights[str(n)]
        if seen >= p * total * (1 - 1e-12):
            return bucket_end(n)
    return bucket_end(buckets[-1])
