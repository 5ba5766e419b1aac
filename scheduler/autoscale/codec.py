"""An autoscaler's samples, histograms and policy state as plain JSON, and back: the form the
autoscaler carries from one interval to the next (activities/autoscale_state.py) and the form its
kept steps are replayed from (scheduler/autoscale/kept.py). Histogram bounds are written as
strings ("inf" for +Inf): JSON has no infinity. What is read back is checked field by field (it
arrives through Temporal, or from the store): a bad value raises ValueError or TypeError; a field
written before it existed decodes to its default (a sample without histograms is no latency
evidence; no ``last_step_at`` is no step yet)."""

from __future__ import annotations

from dataclasses import asdict

from scheduler.autoscale.histogram import Histogram
from scheduler.autoscale.policy import PolicyState
from scheduler.autoscale.signals import Sample

HISTOGRAMS = ("latency", "queue_time", "gateway_queue_time", "ttft", "itl")  # a Sample's


def hist_out(h: Histogram | None) -> dict | None:
    if h is None:
        return None
    return {"buckets": [[repr(le), n] for le, n in h.buckets], "count": h.count, "sum": h.sum}


def hist_in(h: dict | None) -> Histogram | None:
    if h is None:
        return None
    return Histogram(buckets=tuple((float(le), float(n)) for le, n in h["buckets"]),
                     count=float(h["count"]), sum=float(h["sum"]))


def num(v):
    """A number or None, as a float."""
    return None if v is None else float(v)


def sample_in(d: dict) -> Sample:
    """Every field checked: the carry arrives through Temporal (a bad one raises ValueError/TypeError)."""
    return Sample(at=float(d["at"]), running_replicas=int(d["running_replicas"]),
                  complete=bool(d.get("complete", True)), requests=float(d.get("requests", 0.0)),
                  queue=float(d.get("queue", 0.0)), tpot_s=num(d.get("tpot_s")),
                  latency_p95_s=num(d.get("latency_p95_s")), queue_time_p90_s=num(d.get("queue_time_p90_s")),
                  finished=float(d.get("finished", 0.0)), tpot_sum=float(d.get("tpot_sum", 0.0)),
                  tpot_count=float(d.get("tpot_count", 0.0)), kv_usage=_fraction(d.get("kv_usage")),
                  concurrency=_count(d.get("concurrency")),
                  **{k: hist_in(d.get(k)) for k in HISTOGRAMS})


def _fraction(v) -> float | None:
    if v is None:
        return None
    f = float(v)
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"kv_usage {f!r} is not a fraction in [0, 1]")
    return f


def _count(v) -> float | None:
    if v is None:
        return None
    f = float(v)
    if not 0.0 <= f <= 1e9:
        raise ValueError(f"concurrency {f!r} is not a count of requests")
    return f


def sample_out(s: Sample) -> dict:
    d = {k: v for k, v in asdict(s).items() if k not in HISTOGRAMS}
    return {**d, **{k: hist_out(getattr(s, k)) for k in HISTOGRAMS}}


def state_in(d: dict | None) -> PolicyState:
    d = d or {}
    return PolicyState(direction=int(d.get("direction", 0)), since=num(d.get("since")),
                       last_up_at=num(d.get("last_up_at")), last_step_at=num(d.get("last_step_at")),
                       wanted=None if d.get("wanted") is None else _replicas(d["wanted"]))


def _replicas(v) -> int:
    n = int(v)
    if not 0 <= n <= 1000:
        raise ValueError(f"wanted {v!r} is not a replica count")
    return n
