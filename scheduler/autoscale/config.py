"""The model spec's ``autoscaling`` block (docs/formats.md). Changing it never restarts running
replicas. The rules' defaults are the product brief's thresholds:

- ``queue_tpot``: queue depth >= 8 per replica and TPOT > 120 ms: up; queue <= 2 and TPOT < 60 ms:
  down; otherwise hold.
- ``latency_p95``: P95 request latency above 350 ms: add two; below 200 ms: remove one; 200-350
  ms: hold.
- ``queue_time_p90``: the P90 of queueing time above 800 ms: up; below ``down_below_s``: down.

Evidence (rules.py, after Knative's KPA): a rule judges the window's requests together (their
histograms merged, the queue averaged) over ``stable_window_s`` (60 s), and votes only when the
window holds ``min_samples`` requests (20) that all arrived after the last scale step. A burst is
judged sooner, on the last ``panic_window_s`` (6 s, at least one interval), only when it shows
``panic_threshold`` (2.0) times the rule's up threshold: twice the capacity the threshold stands
for. With several rules, any rule voting up wins (the largest step); down needs every rule to vote
down (the smallest step)."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BeforeValidator, Field, model_validator

from scheduler.fields import Strict

MAX_REPLICAS_BOUND = 1000  # a sanity bound; the deployment's own replica maximum applies too
MIN_SAMPLES = ("Requests the window must hold (finished in it, plus in flight and waiting at its end), all "
               "arrived after the last scale step, before the rule votes; with fewer it holds (a window with "
               "no request at all is idle, see the policy). Default 20.")


class QueueTpot(Strict):
    kind: Literal["queue_tpot"] = "queue_tpot"
    up_queue: float = Field(8, ge=0, le=1e6, description="Requests waiting per RUNNING replica, at or above which (with TPOT) it votes up. Default 8.")
    up_tpot_s: float = Field(0.120, ge=0, le=1e6, description="Time per output token above which (with the queue) it votes up. Default 0.120 s.")
    down_queue: float = Field(2, ge=0, le=1e6, description="Queue at or below which (with TPOT) it votes down. Default 2.")
    down_tpot_s: float = Field(0.060, ge=0, le=1e6, description="TPOT below which (with the queue) it votes down. Default 0.060 s.")
    up_step: int = Field(1, ge=1, le=100, description="Replicas an up vote adds. Default 1.")
    min_samples: int = Field(20, ge=1, le=1_000_000, description=MIN_SAMPLES)


class LatencyP95(Strict):
    kind: Literal["latency_p95"] = "latency_p95"
    up_above_s: float = Field(0.350, gt=0, le=1e6, description="P95 latency above which it adds ``up_step``. Default 0.350 s.")
    up_window_s: float | None = Field(None, gt=0, le=1e6, description="The window the P95 is taken over for an up "
                                      "vote. Default: the block's ``stable_window_s``.")
    up_step: int = Field(2, ge=1, le=100, description="Replicas added. Default 2.")
    down_below_s: float = Field(0.200, gt=0, le=1e6, description="P95 latency below which it removes ``down_step``. Default 0.200 s.")
    down_window_s: float | None = Field(None, gt=0, le=1e6, description="The window the P95 is taken over for a down "
                                        "vote. Default: the block's ``stable_window_s``.")
    down_step: int = Field(1, ge=1, le=100, description="Replicas removed. Default 1.")
    min_samples: int = Field(20, ge=1, le=1_000_000, description=MIN_SAMPLES)


class QueueTimeP90(Strict):
    kind: Literal["queue_time_p90"] = "queue_time_p90"
    up_above_s: float = Field(0.800, gt=0, le=1e6, description="P90 of queueing time above which it votes up. Default 0.800 s.")
    samples: int | None = Field(None, ge=1, le=100, description="The window the P90 is taken over, in intervals "
                                "(``samples`` x ``interval_s``). Default: the block's ``stable_window_s``.")
    down_below_s: float = Field(0.100, ge=0, le=1e6, description="P90 below which (or no queueing measured) it votes down. Default 0.100 s.")
    min_samples: int = Field(20, ge=1, le=1_000_000, description=MIN_SAMPLES)


Rule = Annotated[Union[QueueTpot, LatencyP95, QueueTimeP90], Field(discriminator="kind")]


def _named(v):
    """``rules: [queue_tpot, {kind: latency_p95, up_above_s: 0.5}]``: a bare name is its defaults."""
    if isinstance(v, list):
        return [{"kind": r} if isinstance(r, str) else r for r in v]
    return v


class Autoscaling(Strict):
    min_replicas: int = Field(1, ge=0, le=MAX_REPLICAS_BOUND, description="May be 0 (scale to zero). Default 1.")
    max_replicas: int = Field(1, ge=1, le=MAX_REPLICAS_BOUND, description="Default 1.")
    interval_s: float = Field(15, ge=1, le=3600, description="Signals are gathered and a decision made this often. Default 15 s.")
    rules: Annotated[list[Rule], BeforeValidator(_named)] = Field(default_factory=lambda: [QueueTpot()], min_length=1,
                                                                  max_length=8)
    scale_up_stabilization_s: float = Field(0, ge=0, le=86400, description="An up vote must hold this long. Default 0 s.")
    scale_down_stabilization_s: float = Field(300, ge=0, le=86400, description="A down vote must hold this long, and the signals must cover it. Default 300 s.")
    max_step: int = Field(4, ge=1, le=MAX_REPLICAS_BOUND, description="Most replicas added or removed in one decision. Default 4.")
    stable_window_s: float = Field(60, ge=1, le=86400, description="The window a rule judges by default (Knative's "
                                   "stable window); never shorter than ``interval_s``. Default 60 s.")
    panic_window_s: float = Field(6, ge=1, le=86400, description="The short window a burst is judged on (Knative's "
                                  "panic window, 10% of the stable one); never shorter than ``interval_s``, so "
                                  "at the default 15 s interval it is the last sample. Default 6 s.")
    panic_threshold: float = Field(2.0, ge=1, le=1000, description="The panic window votes up only when its signal "
                                   "is at least this many times the rule's up threshold (Knative's 200%). Default 2.0.")

    @model_validator(mode="after")
    def _coherent(self) -> "Autoscaling":
        if self.panic_window_s > self.stable_window_s:
            raise ValueError(f"panic_window_s {self.panic_window_s:g} is longer than stable_window_s "
                             f"{self.stable_window_s:g}")
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} is above max_replicas {self.max_replicas}")
        kinds = [r.kind for r in self.rules]
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"a rule is given twice: {kinds}")
        return self
