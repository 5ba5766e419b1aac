"""What the recommender keeps per fingerprint (``ClaimState``), and how a measured peak or an
over-use changes it. Plain data (pydantic), so the store keeps it as JSON and a decision keeps it
in its inputs; bounded (the histogram's buckets are, the rest are scalars)."""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from scheduler.claims.histogram import Histogram, add
from scheduler.claims.settings import ClaimSettings
from scheduler.units import GiB, MiB

BUMP_RATIO = 1.2  # VPA's --oom-bump-up-ratio
BUMP_MIN = 100 * MiB  # VPA's --oom-min-bump-up-bytes (100 MB there; MiB here)
# A use over the claim bumps it only past this slack: the CUDA context (0.5 GiB on an H200, measured by
# bench/gpu_claim_check.py) and an engine's CUDA graphs sit outside the share vLLM and SGLang are told
# to take, so an up-front engine measures a little over its claim every time; bumped for it, the next
# placement's larger share would be over again, 1.2x a round
OVER_USE_SLACK = GiB
OVER_USE_SLACK_RATIO = 0.05


def over_claim(used: int, claimed: int) -> bool:
    """Whether ``used`` bytes on a GPU are over its ``claimed`` bytes by more than the slack: the
    larger of 1 GiB and 5% of the claim (0 claimed: no claim to be over)."""
    return claimed > 0 and used > claimed + max(OVER_USE_SLACK, math.ceil(claimed * OVER_USE_SLACK_RATIO))


class ClaimState(BaseModel):
    hist: Histogram = Field(default_factory=Histogram)
    samples: int = Field(0, ge=0)  # measured peaks taken, ever (VPA's TotalSamplesCount; not decayed)
    first_s: float | None = None  # the first and the latest sample's time (seconds since the epoch)
    last_s: float | None = None
    peak: int = Field(0, ge=0)  # the largest peak measured
    bump: int = Field(0, ge=0)  # the claim an OOM or an over-use raised it to (0: none)
    bump_s: float | None = None  # when
    bump_samples: int = Field(0, ge=0)  # ``samples`` then: the bump holds until a confident history follows it
    bump_why: str = ""  # "oom" or "over-use"

    def span_s(self) -> float:
        return 0.0 if self.first_s is None or self.last_s is None else max(0.0, self.last_s - self.first_s)


def bumped(x: int) -> int:
    """VPA's OOM bump: the larger of 1.2x and x + 100 MiB."""
    return max(math.ceil(x * BUMP_RATIO), x + BUMP_MIN)


def observe(state: ClaimState, peak: int, now: float, settings: ClaimSettings) -> ClaimState:
    """``state`` with one more measured peak (bytes) taken at ``now``."""
    return state.model_copy(update=dict(
        hist=add(state.hist, peak, now, settings.half_life_s), samples=state.samples + 1,
        first_s=now if state.first_s is None else min(state.first_s, now),
        last_s=now if state.last_s is None else max(state.last_s, now), peak=max(state.peak, peak)))


def bump_active(state: ClaimState, now: float, settings: ClaimSettings) -> bool:
    """A bump holds until a confident history follows it (MIN_SAMPLES more samples over
    MIN_HISTORY_S); the histogram, which holds the bump as a sample, decides from then on."""
    if not state.bump or state.bump_s is None:
        return False
    return (now - state.bump_s < settings.min_history_s
            or state.samples - state.bump_samples < settings.min_samples)


def bump(state: ClaimState, used: int, claim: int, now: float, settings: ClaimSettings, why: str) -> ClaimState:
    """An OOM (``why`` "oom") or a replica using more than its claim ("over-use"): the claim goes
    at once to the larger of 1.2x and +100 MiB over the larger of what it used and what it was
    booked. The bump is a floor beside the histogram, not a sample in it (VPA adds its OOM bump as
    a sample, which the margin would then raise by 15% more); the peaks that led to it are in the
    histogram already, as measured."""
    target = bumped(max(used, claim))
    if bump_active(state, now, settings) and state.bump >= target:
        return state  # already there: the same over-use reported again changes nothing
    return state.model_copy(update=dict(bump=target, bump_s=now, bump_samples=state.samples, bump_why=why,
                                        peak=max(state.peak, used)))
