"""The model spec's ``autoscaling`` block (docs/formats.md). Changing it never restarts running
replicas. The rules' defaults are the product brief's thresholds:

- ``queue_tpot``: queue depth >= 8 per replica and TPOT > 120 ms: up; queue <= 2 and TPOT < 60 ms:
  down; otherwise hold.
- ``latency_p95``: P95 request latency above 350 ms over 15 s: add two; below 200 ms over 30 s:
  remove one; 200-350 ms: hold.
- ``queue_time_p90``: the P90 of queueing time above 800 ms in 3 consecutive samples: up. It votes
  down only when queueing stayed below ``down_below_s`` over its samples, so it never blocks an
  idle deployment from shrinking.

With several rules, any rule voting up wins (the largest step); down needs every rule to vote down
(the smallest step)."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BeforeValidator, Field, model_validator

from scheduler.fields import Strict

MAX_REPLICAS_BOUND = 1000  # a sanity bound; the deployment's own replica maximum applies too


class QueueTpot(Strict):
    kind: Literal["queue_tpot"] = "queue_tpot"
    up_queue: float = Field(8, ge=0, le=1e6, description="Requests waiting per RUNNING replica, at or above which (with TPOT) it votes up. Default 8.")
    up_tpot_s: float = Field(0.120, ge=0, le=1e6, description="Time per output token above which (with the queue) it votes up. Default 0.120 s.")
    down_queue: float = Field(2, ge=0, le=1e6, description="Queue at or below which (with TPOT) it votes down. Default 2.")
    down_tpot_s: float = Field(0.060, ge=0, le=1e6, description="TPOT below which (with the queue) it votes down. Default 0.060 s.")
    up_step: int = Field(1, ge=1, le=100, description="Replicas an up vote adds. Default 1.")


class LatencyP95(Strict):
    kind: Literal["latency_p95"] = "latency_p95"
    up_above_s: float = Field(0.350, gt=0, le=1e6, description="P95 latency above which it adds ``up_step``. Default 0.350 s.")
    up_window_s: float = Field(15, gt=0, le=1e6, description="The P95 must stay above for this long. Default 15 s.")
    up_step: int = Field(2, ge=1, le=100, description="Replicas added. Default 2.")
    down_below_s: float = Field(0.200, gt=0, le=1e6, description="P95 latency below which it removes ``down_step``. Default 0.200 s.")
    down_window_s: float = Field(30, gt=0, le=1e6, description="The P95 must stay below for this long. Default 30 s.")
    down_step: int = Field(1, ge=1, le=100, description="Replicas removed. Default 1.")


class QueueTimeP90(Strict):
    kind: Literal["queue_time_p90"] = "queue_time_p90"
    up_above_s: float = Field(0.800, gt=0, le=1e6, description="P90 of queueing time above which it votes up. Default 0.800 s.")
    samples: int = Field(3, ge=1, le=100, description="Consecutive samples above the threshold needed. Default 3.")
    down_below_s: float = Field(0.100, ge=0, le=1e6, description="Votes down when the P90 stayed below this over ``samples``. Default 0.100 s.")


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

    @model_validator(mode="after")
    def _coherent(self) -> "Autoscaling":
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} is above max_replicas {self.max_replicas}")
        kinds = [r.kind for r in self.rules]
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"a rule is given twice: {kinds}")
        return self
