"""The recommender's settings (``GPUFLOW_CLAIMS__*``; gpuflow/settings.py's ``claims`` section).

The defaults are Kubernetes VPA's recommender's (kubernetes/autoscaler,
vertical-pod-autoscaler/docs/flags.md; /work/shared/reference/pd-claims-docs.md and
routing-console-memory.md): the target is the 90th percentile of the peaks plus a 15% margin,
history decays with a 24 h half-life. VPA's confidence in a recommendation is
min(days of history, samples / 1440) (its recommender's ``getConfidence``: 1440 is a day of its
once-a-minute samples); the confidence it calls 1 is MIN_HISTORY_S = 86,400 s and MIN_SAMPLES =
1,440, so a learned claim is trusted from there (a test or a rehearsal sets both low)."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, Field

DAY_S = 86_400.0
VPA_SAMPLES_PER_DAY = 1440  # VPA counts a day of once-a-minute samples as confidence 1


class ClaimMode(str, Enum):
    ADVISE = "advise"  # show what each learned claim would change; book the estimate
    APPLY = "apply"  # new placements book the learned claim, once it is confident


class ClaimSettings(BaseModel):
    mode: ClaimMode = Field(ClaimMode.ADVISE, description="What learned memory claims do: advise (show what each would change and how much room it would free; placements book the estimate) or apply (new placements book the learned claim once it is confident). A deployment's spec may override it with claims: advise|apply. Default advise.")
    percentile: float = Field(0.9, gt=0, le=1, description="The percentile of a fingerprint's measured peaks (decayed histogram) the learned claim targets, as a fraction. Default 0.9 (VPA's target).")
    margin: float = Field(0.15, ge=0, le=10, description="The safety margin added to the percentile, as a fraction of it. Default 0.15 (VPA's).")
    half_life_s: float = Field(DAY_S, gt=0, le=365 * DAY_S, description="The half-life of a measured peak's weight in the histogram, in seconds. Default 86400 (24 h, VPA's).")
    min_samples: int = Field(VPA_SAMPLES_PER_DAY, ge=1, le=10**9, description="A learned claim is confident (used in apply mode) only from this many measured samples (one per replica per usage report). Default 1440 (VPA's confidence 1: a day of once-a-minute samples).")
    min_history_s: float = Field(DAY_S, ge=0, le=365 * DAY_S, description="A learned claim is confident only once its samples span this many seconds. Default 86400 (VPA's confidence 1: a day of history).")
