"""The model spec's ``autoscaling`` block (docs/formats.md). Changing it never restarts running
replicas. The rules' defaults are the product brief's thresholds:

- ``queue_tpot``: queue depth >= 8 per replica and TPOT > 120 ms: up; queue <= 2 and TPOT < 60 ms:
  down; otherwise hold.
- ``latency_p95``: P95 request latency above 350 ms: add two; below 200 ms: remove one; 200-350
  ms: hold.
- ``queue_time_p90``: the P90 of queueing time above 800 ms: up; below ``down_below_s``: down.
- ``concurrency`` and ``rps`` (issue 38, Knative KPA's metrics): no thresholds; the count is computed,
  ceil(requests in the system, or arriving per second, / ``target``), and reached in one step
  (kpa.py), within HPA's ``tolerance`` and the block's step rates (``max_scale_up_rate`` 1000,
  ``max_scale_down_rate`` 2, KPA's defaults).

Evidence (rules.py, after Knative's KPA): a rule judges the window's requests together (their
histograms merged, the queue averaged) over ``stable_window_s`` (60 s), and votes only when the
window holds ``min_samples`` requests (20) that all arrived after the last scale step. A burst is
judged sooner, on the last ``panic_window_s`` (6 s, at least one interval), only when it shows
``panic_threshold`` (2.0) times the rule's up threshold: twice the capacity the threshold stands
for. With several rules, any rule voting up wins (the largest step); down needs every rule to vote
down (the smallest step).

A prefill/decode group is scaled per role (``roles``, after Dynamo's SLA planner, which sizes prefill
from TTFT and decode from ITL independently): ``ttft`` (P90 above 500 ms) and ``queue`` for a
prefill, ``itl`` (P90 above 50 ms), ``tpot`` and ``kv_usage`` (above 0.85) for a decode. Each role
has its own bounds, rules and anti-flap state; the windows and their evidence gates are the block's."""

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


class Ttft(Strict):
    """A prefill's cost: the quantile of time to first token (Dynamo's planner sizes prefill on it)."""
    kind: Literal["ttft"] = "ttft"  # `ttft`: a quantile of time to first token (a prefill's rule).
    quantile: float = Field(0.9, ge=0.5, le=0.99, description="The quantile of time to first token judged. Default 0.9 (P90).")
    up_above_s: float = Field(0.500, gt=0, le=1e6, description="TTFT quantile above which it adds ``up_step``. Default 0.500 s "
                              "(Dynamo's example SLA: TTFT under 500 ms).")
    down_below_s: float = Field(0.150, gt=0, le=1e6, description="TTFT quantile below which it removes one. Default 0.150 s.")
    up_step: int = Field(1, ge=1, le=100, description="Replicas added. Default 1.")
    min_samples: int = Field(20, ge=1, le=1_000_000, description=MIN_SAMPLES)


class Itl(Strict):
    """A decode's cost: the quantile of inter-token latency (Dynamo's planner sizes decode on it)."""
    kind: Literal["itl"] = "itl"  # `itl`: a quantile of inter-token latency (a decode's rule).
    quantile: float = Field(0.9, ge=0.5, le=0.99, description="The quantile of inter-token latency judged. Default 0.9 (P90).")
    up_above_s: float = Field(0.050, gt=0, le=1e6, description="ITL quantile above which it adds ``up_step``. Default 0.050 s "
                              "(Dynamo's example SLA: ITL 50 ms).")
    down_below_s: float = Field(0.020, gt=0, le=1e6, description="ITL quantile below which it removes one. Default 0.020 s.")
    up_step: int = Field(1, ge=1, le=100, description="Replicas added. Default 1.")
    min_samples: int = Field(20, ge=1, le=1_000_000, description=MIN_SAMPLES)


class Tpot(Strict):
    """A decode's cost on average: time per output token, the mean gap between tokens."""
    kind: Literal["tpot"] = "tpot"  # `tpot`: the mean time per output token (a decode's rule).
    up_above_s: float = Field(0.050, gt=0, le=1e6, description="Mean TPOT above which it adds ``up_step``. Default 0.050 s.")
    down_below_s: float = Field(0.020, gt=0, le=1e6, description="Mean TPOT below which it removes one. Default 0.020 s.")
    up_step: int = Field(1, ge=1, le=100, description="Replicas added. Default 1.")
    min_samples: int = Field(20, ge=1, le=1_000_000, description=MIN_SAMPLES)


class KvUsage(Strict):
    """A decode's memory: the engines' KV-cache usage (``vllm:kv_cache_usage_perc``, a fraction),
    averaged over the window's samples. Above the up threshold, new sequences start to wait or be
    preempted."""
    kind: Literal["kv_usage"] = "kv_usage"  # `kv_usage`: the engines' mean KV-cache usage, 0-1 (a decode's rule).
    up_above: float = Field(0.85, gt=0, le=1, description="Mean KV-cache usage (0-1) above which it adds ``up_step``. Default 0.85.")
    down_below: float = Field(0.40, ge=0, le=1, description="Mean KV-cache usage below which it removes one. Default 0.40.")
    up_step: int = Field(1, ge=1, le=100, description="Replicas added. Default 1.")
    min_samples: int = Field(20, ge=1, le=1_000_000, description=MIN_SAMPLES)


class Queue(Strict):
    """Requests waiting per RUNNING replica, alone (a prefill's queue: its waiting prompts)."""
    kind: Literal["queue"] = "queue"  # `queue`: mean requests waiting per replica (a prefill's rule).
    up_queue: float = Field(4, gt=0, le=1e6, description="Mean requests waiting per replica at or above which it adds ``up_step``. Default 4.")
    down_queue: float = Field(0.5, ge=0, le=1e6, description="Mean waiting per replica at or below which it removes one. Default 0.5.")
    up_step: int = Field(1, ge=1, le=100, description="Replicas added. Default 1.")
    min_samples: int = Field(20, ge=1, le=1_000_000, description=MIN_SAMPLES)


class Concurrency(Strict):
    """Knative KPA's metric: the requests in the system (served, waiting in an engine or in a
    gateway's queue) and their target per replica. The desired count is computed, not stepped:
    ceil(observed / ``target``), and the autoscaler moves there in one step (scheduler/autoscale/kpa.py)."""
    kind: Literal["concurrency"] = "concurrency"  # `concurrency`: requests in the system per replica (KPA's metric).
    target: float = Field(8, gt=0, le=1e6, description="Requests in the system (served plus waiting) one replica "
                          "should hold: the desired count is ceil(observed / target). Knative's "
                          "container-concurrency-target; set it to the batch your engine serves at a good TPOT. Default 8.")
    tolerance: float = Field(0.1, ge=0, le=0.9, description="Kubernetes HPA's tolerance: up only when the observed "
                             "value is over the running replicas' share by more than this fraction, and down only to a "
                             "count that keeps each replica this fraction under its target (a dead band: no flapping "
                             "on a load that hovers at a count's edge). Default 0.1.")
    min_samples: int = Field(20, ge=1, le=1_000_000, description=MIN_SAMPLES)


class Rps(Strict):
    """Knative KPA's other metric: requests arriving per second, and their target per replica.
    Arrivals, not what was served: a backlog that built while replicas started is no new demand
    (where ``concurrency`` counts it), so an open load is met without overshoot. desired =
    ceil(observed rate / ``target``), in one step (scheduler/autoscale/kpa.py)."""
    kind: Literal["rps"] = "rps"  # `rps`: requests arriving per second per replica (KPA's rps metric).
    target: float = Field(..., gt=0, le=1e6, description="Requests per second one replica should serve: the "
                          "desired count is ceil(arrivals per second / target). Knative's rps target; measure "
                          "your engine's rate at a good latency. Required.")
    tolerance: float = Field(0.1, ge=0, le=0.9, description="Kubernetes HPA's tolerance: up only when the observed "
                             "value is over the running replicas' share by more than this fraction, and down only to a "
                             "count that keeps each replica this fraction under its target (a dead band: no flapping "
                             "on a load that hovers at a count's edge). Default 0.1.")
    min_samples: int = Field(20, ge=1, le=1_000_000, description=MIN_SAMPLES)


Rule = Annotated[Union[QueueTpot, LatencyP95, QueueTimeP90, Ttft, Itl, Tpot, KvUsage, Queue, Concurrency, Rps],
                 Field(discriminator="kind")]


def _named(v):
    """``rules: [queue_tpot, {kind: latency_p95, up_above_s: 0.5}]``: a bare name is its defaults."""
    if isinstance(v, list):
        return [{"kind": r} if isinstance(r, str) else r for r in v]
    return v


ROLE_RULES = {"prefill": ("ttft", "queue", "queue_time_p90"),  # a prefill's cost is the first token
              "decode": ("itl", "tpot", "kv_usage", "queue_tpot")}  # a decode's, the tokens after it and their KV
ROLE_DEFAULT_RULE = {"prefill": "ttft", "decode": "itl"}


class RoleAutoscaling(Strict):
    """One role of a prefill/decode group, scaled on its own signals (scheduler/autoscale/roles.py)."""

    min_replicas: int = Field(1, ge=1, le=MAX_REPLICAS_BOUND, description="The role's fewest replicas; at least 1 "
                              "(a group without a role's members does not serve). Default 1.")
    max_replicas: int = Field(1, ge=1, le=MAX_REPLICAS_BOUND, description="The role's most replicas. Default 1.")
    rules: Annotated[list[Rule] | None, BeforeValidator(_named)] = Field(
        None, min_length=1, max_length=8, description="The role's rules: prefill takes ttft, queue, queue_time_p90; "
        "decode takes itl, tpot, kv_usage, queue_tpot. Default: [ttft] for prefill, [itl] for decode.")
    max_step: int | None = Field(None, ge=1, le=MAX_REPLICAS_BOUND, description="Most of the role's replicas added or "
                                 "removed in one decision. Default: the block's ``max_step``.")
    scale_up_stabilization_s: float | None = Field(None, ge=0, le=86400, description="Default: the block's.")
    scale_down_stabilization_s: float | None = Field(None, ge=0, le=86400, description="Default: the block's.")


class Autoscaling(Strict):
    min_replicas: int = Field(1, ge=0, le=MAX_REPLICAS_BOUND, description="May be 0 (scale to zero). Default 1.")
    max_replicas: int = Field(1, ge=1, le=MAX_REPLICAS_BOUND, description="Default 1.")
    interval_s: float = Field(15, ge=1, le=3600, description="Signals are gathered and a decision made this often. Default 15 s.")
    rules: Annotated[list[Rule], BeforeValidator(_named)] = Field(default_factory=lambda: [QueueTpot()], min_length=1,
                                                                  max_length=8)
    scale_up_stabilization_s: float = Field(0, ge=0, le=86400, description="An up vote must hold this long. Default 0 s.")
    scale_down_stabilization_s: float = Field(300, ge=0, le=86400, description="A down vote must hold this long, and the signals must cover it. Default 300 s.")
    max_step: int | None = Field(None, ge=1, le=MAX_REPLICAS_BOUND, description="Most replicas added or removed in "
                                 "one decision, whatever the rates allow. Default: none (the rates bound a step).")
    max_scale_up_rate: float | None = Field(1000, ge=1, le=1e6, description="A step goes to at most this many times "
                                            "the RUNNING replicas (ceil(rate x running), 1 running when none is). "
                                            "Knative's max-scale-up-rate. Default 1000; null: no bound.")
    max_scale_down_rate: float | None = Field(2, ge=1, le=1e6, description="A step keeps at least the RUNNING "
                                              "replicas divided by this (floor): 2 at most halves them. Knative's "
                                              "max-scale-down-rate. Default 2; null: no bound.")
    stable_window_s: float = Field(60, ge=1, le=86400, description="The window a rule judges by default (Knative's "
                                   "stable window); never shorter than ``interval_s``. Default 60 s.")
    panic_window_s: float = Field(6, ge=1, le=86400, description="The short window a burst is judged on (Knative's "
                                  "panic window, 10% of the stable one); never shorter than ``interval_s``, so "
                                  "at the default 15 s interval it is the last sample. Default 6 s.")
    panic_threshold: float = Field(2.0, ge=1, le=1000, description="The panic window votes up only when its signal "
                                   "is at least this many times the rule's up threshold (Knative's 200%). Default 2.0.")
    roles: dict[Literal["prefill", "decode"], RoleAutoscaling] | None = Field(
        None, min_length=1, max_length=2, description="A prefill/decode group's rules per role, each role scaled on its "
        "own (a role left out keeps its replicas); the block's min_replicas, max_replicas and rules are then not given. "
        "Only on a spec with roles.")

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
        if self.roles:
            # by value, not by fields set: a block dumped and read back (a role's effective spec) sets every field
            given = [k for k, v in (("min_replicas", self.min_replicas != 1), ("max_replicas", self.max_replicas != 1),
                                    ("rules", self.rules != [QueueTpot()])) if v]
            if given:
                raise ValueError(f"autoscaling.{given[0]}: a group is autoscaled per role; give it under "
                                 f"autoscaling.roles.<role> instead")
            for name, r in self.roles.items():
                _role_coherent(name, r)
        return self


def _role_coherent(name: str, r: RoleAutoscaling) -> None:
    if r.min_replicas > r.max_replicas:
        raise ValueError(f"autoscaling.roles.{name}: min_replicas {r.min_replicas} is above max_replicas {r.max_replicas}")
    kinds = [x.kind for x in r.rules or []]
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"autoscaling.roles.{name}.rules: a rule is given twice: {kinds}")
    wrong = [k for k in kinds if k not in ROLE_RULES[name]]
    if wrong:
        raise ValueError(f"autoscaling.roles.{name}.rules: {wrong[0]} does not measure a {name}'s work; "
                         f"a {name} takes {', '.join(ROLE_RULES[name])}")


def keep_s(a: Autoscaling) -> float:
    """How far back the samples are carried: the longest window any rule or stabilization reads."""
    rule_windows = [getattr(r, k, None) or 0 for r in a.rules for k in ("up_window_s", "down_window_s")]
    rule_windows += [(getattr(r, "samples", None) or 0) * a.interval_s for r in a.rules]
    return max([a.scale_down_stabilization_s, a.scale_up_stabilization_s, a.interval_s, a.stable_window_s,
                *rule_windows]) + 3 * a.interval_s
