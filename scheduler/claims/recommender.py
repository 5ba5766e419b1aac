"""The learned claim for one fingerprint, VPA's way: the ``percentile`` of the decayed histogram
of measured peaks plus ``margin``; never below the weights' size; an OOM's or over-use's bump at
once; trusted (``confident``) only from MIN_SAMPLES samples over MIN_HISTORY_S. Until then the
estimate stays the prior: the caller books ``booked(rec, estimate)``.

``confidence`` is VPA's figure, min(days of history, samples / 1440): 1.0 is a day of history and
a day's worth of once-a-minute samples. It is shown; the settings decide."""

from __future__ import annotations

import math

from pydantic import BaseModel

from scheduler.claims.histogram import percentile as hist_percentile
from scheduler.claims.settings import DAY_S, VPA_SAMPLES_PER_DAY, ClaimSettings
from scheduler.claims.state import ClaimState, bump_active
from scheduler.claims.words import duration, history_words, size

STALE_WEIGHT = 1e-3  # the histogram's weight seen from now, below which its history has decayed away (~10 half-lives)


class Recommendation(BaseModel):
    """What the recommender says for one fingerprint at ``now``: kept as is in a decision's inputs."""

    claim_bytes: int | None  # the learned claim (None: no history; the estimate stays)
    samples: int
    span_s: float
    percentile: float
    margin: float
    confidence: float  # VPA's: min(days of history, samples / 1440)
    confident: bool  # passes MIN_SAMPLES and MIN_HISTORY_S, or a bump holds: apply mode books claim_bytes
    reason: str
    percentile_bytes: int | None = None  # the histogram's percentile, before the margin
    floor_bytes: int = 0  # the weights' size: the claim never falls below it
    bump_bytes: int = 0  # an OOM's or over-use's bump that holds now (0: none)
    bump_why: str = ""
    peak_bytes: int = 0  # the largest peak measured
    estimate_bytes: int | None = None  # the estimate it stands against, when the caller gave it


def confidence(state: ClaimState) -> float:
    return min(state.span_s() / DAY_S, state.samples / VPA_SAMPLES_PER_DAY)


def sure(state: ClaimState, settings: ClaimSettings) -> bool:
    """The history passes the confidence floor: MIN_SAMPLES samples over MIN_HISTORY_S."""
    return state.samples >= settings.min_samples and state.span_s() >= settings.min_history_s


def booked(rec: Recommendation, estimate: int) -> int:
    """What a placement books: the learned claim once confident, otherwise the estimate."""
    return rec.claim_bytes if rec.confident and rec.claim_bytes is not None else estimate


def recommend(state: ClaimState, settings: ClaimSettings, now: float, *, estimate_bytes: int | None = None,
              weights_bytes: int = 0) -> Recommendation:
    base = dict(samples=state.samples, span_s=state.span_s(), percentile=settings.percentile, margin=settings.margin,
                confidence=round(confidence(state), 4), floor_bytes=weights_bytes, peak_bytes=state.peak,
                estimate_bytes=estimate_bytes)
    bump = state.bump if bump_active(state, now, settings) else 0
    stale = state.hist.total_at(now, settings.half_life_s) < STALE_WEIGHT
    if (not state.samples or stale) and not bump:
        why = ("the measured peaks decayed away" if state.samples else "no measured peaks yet") + ": the estimate stays"
        return Recommendation(claim_bytes=None, confident=False, reason=why, **base)
    p = hist_percentile(state.hist, settings.percentile) or 0
    target = math.ceil(p * (1 + settings.margin))
    claim = max(target, weights_bytes, bump)
    trusted = sure(state, settings)
    why = (f"p{settings.percentile * 100:g} {size(p)} + {settings.margin * 100:g}% = {size(target)}, "
           f"from {history_words(state.samples, state.span_s())}")
    if weights_bytes > target and weights_bytes >= bump:
        why += f"; raised to the weights' {size(weights_bytes)}"
    if bump and bump >= max(target, weights_bytes):
        why = (f"bumped to {size(bump)} after {'an OOM' if state.bump_why == 'oom' else 'a use over its claim'} "
               f"(the larger of 1.2x and +100 MiB); {why}")
    elif not trusted:
        why += (f"; learning: {state.samples:,} of {settings.min_samples:,} samples, {duration(state.span_s())} "
                f"of {duration(settings.min_history_s)} of history: the estimate stays")
    return Recommendation(claim_bytes=claim, confident=trusted or bool(bump), reason=why, percentile_bytes=p,
                          bump_bytes=bump, bump_why=state.bump_why if bump else "", **base)
