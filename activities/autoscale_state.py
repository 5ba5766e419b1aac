"""What the autoscaler carries from one interval to the next, as plain JSON (the workflow holds it
and passes it back in, so a control-plane worker can die between two steps): the previous scrape
of every source (an engine by instance name, a gateway by its id), the recent samples the policy
reads (each with its window's histograms, sparse: only the bounds its observations need), and the
policy's state. Histogram bounds are written as strings ("inf" for +Inf): JSON has no infinity. A
carry written before a field existed decodes with that field's default (a sample without
histograms is no latency evidence; no ``last_step_at`` is no step yet), so running autoscalers
carry on."""

from __future__ import annotations

from dataclasses import asdict

from activities.autoscale_scrape import Scrape
from scheduler.autoscale.histogram import Histogram
from scheduler.autoscale.policy import PolicyState
from scheduler.autoscale.signals import Sample

MAX_SAMPLES = 400  # a bound on what is carried, whatever the windows


HISTOGRAMS = ("latency", "queue_time", "gateway_queue_time")  # a Sample's


def hist_out(h: Histogram | None) -> dict | None:
    if h is None:
        return None
    return {"buckets": [[repr(le), n] for le, n in h.buckets], "count": h.count, "sum": h.sum}


def hist_in(h: dict | None) -> Histogram | None:
    if h is None:
        return None
    return Histogram(buckets=tuple((float(le), float(n)) for le, n in h["buckets"]),
                     count=float(h["count"]), sum=float(h["sum"]))


def scrape_out(s: Scrape) -> dict:
    return {"gauges": dict(s.gauges), "histograms": {k: hist_out(h) for k, h in s.histograms.items()}}


def scrape_in(d: dict) -> Scrape:
    return Scrape(gauges={str(k): float(v) for k, v in (d.get("gauges") or {}).items()},
                  histograms={str(k): hist_in(h) for k, h in (d.get("histograms") or {}).items()})


def _num(v):
    return None if v is None else float(v)


def sample_in(d: dict) -> Sample:
    """Every field checked: the carry arrives through Temporal (a bad one raises ValueError/TypeError)."""
    return Sample(at=float(d["at"]), running_replicas=int(d["running_replicas"]),
                  complete=bool(d.get("complete", True)), requests=float(d.get("requests", 0.0)),
                  queue=float(d.get("queue", 0.0)), tpot_s=_num(d.get("tpot_s")),
                  latency_p95_s=_num(d.get("latency_p95_s")), queue_time_p90_s=_num(d.get("queue_time_p90_s")),
                  finished=float(d.get("finished", 0.0)), tpot_sum=float(d.get("tpot_sum", 0.0)),
                  tpot_count=float(d.get("tpot_count", 0.0)), **{k: hist_in(d.get(k)) for k in HISTOGRAMS})


def sample_out(s: Sample) -> dict:
    d = {k: v for k, v in asdict(s).items() if k not in HISTOGRAMS}
    return {**d, **{k: hist_out(getattr(s, k)) for k in HISTOGRAMS}}


def state_in(d: dict | None) -> PolicyState:
    d = d or {}
    return PolicyState(direction=int(d.get("direction", 0)), since=_num(d.get("since")),
                       last_up_at=_num(d.get("last_up_at")), last_step_at=_num(d.get("last_step_at")))


class Carry:
    """The carried state, decoded."""

    def __init__(self, d: dict | None):
        d = d or {}
        self.scrapes = {str(k): scrape_in(v) for k, v in (d.get("scrapes") or {}).items()}
        self.samples = [sample_in(s) for s in (d.get("samples") or [])]
        self.policy = state_in(d.get("policy"))
        self.hooked = dict(d.get("hooked") or {})  # the last demand told the capacity hook, and when

    def keep(self, now: float, window_s: float) -> None:
        """Only the samples the policy can still read (``window_s`` back), at most MAX_SAMPLES."""
        self.samples = [s for s in self.samples if now - s.at <= window_s][-MAX_SAMPLES:]

    def out(self) -> dict:
        return {"scrapes": {k: scrape_out(v) for k, v in self.scrapes.items()},
                "samples": [sample_out(s) for s in self.samples], "policy": asdict(self.policy),
                "hooked": self.hooked}
