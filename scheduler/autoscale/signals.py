"""One sample of what a deployment suffers, built from each RUNNING replica's engine and from
the gateways over one interval.

Queue depth is requests waiting per RUNNING replica: the engines' waiting counts plus the
gateways' queue, divided by the replicas. Latencies are windowed (histogram deltas, see
histogram.py). An engine without metrics falls back to the gateways' view; an engine whose
scrape failed makes the sample incomplete, and an incomplete sample is never evidence of
idleness (it can still show overload through the gateways)."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.autoscale.histogram import Histogram, mean, merge, quantile, sparse


@dataclass(frozen=True)
class Window:
    """One source's view over one interval: an engine's (``ok`` False when its scrape failed) or
    the gateways' (``waiting`` is then their queue for the model)."""

    ok: bool = True
    waiting: float | None = None  # requests waiting now
    running: float | None = None  # requests being served now
    tpot: Histogram | None = None  # time per output token, observed in the window
    latency: Histogram | None = None  # whole-request latency, observed in the window
    queue_time: Histogram | None = None  # time spent queued, observed in the window
    ttft: Histogram | None = None  # time to first token, observed in the window
    kv_usage: float | None = None  # the engine's KV-cache usage now, 0-1 (vllm:kv_cache_usage_perc)


@dataclass(frozen=True)
class Sample:
    at: float
    running_replicas: int
    complete: bool = True
    requests: float = 0.0  # finished in the window plus in flight now
    queue: float = 0.0  # waiting per RUNNING replica (the whole queue when none runs)
    tpot_s: float | None = None
    latency_p95_s: float | None = None
    queue_time_p90_s: float | None = None
    # the window itself, so that a rule can judge several samples together (evidence.py)
    finished: float = 0.0  # requests that finished in the window
    tpot_sum: float = 0.0  # seconds between tokens observed in the window, summed
    tpot_count: float = 0.0  # and how many gaps
    latency: Histogram | None = None  # whole-request latency observed in the window (sparse)
    queue_time: Histogram | None = None  # the engines' queueing time (sparse)
    gateway_queue_time: Histogram | None = None  # the gateways' queueing time (sparse)
    ttft: Histogram | None = None  # time to first token observed in the window (sparse): a prefill's cost
    itl: Histogram | None = None  # the gaps between tokens observed in the window (sparse): a decode's cost
    kv_usage: float | None = None  # the engines' mean KV-cache usage (0-1) at the sample; None: none publishes it
    # requests in the system at the sample, each once: the gateways' queue, plus the larger of what the
    # gateways have handed to engines and what the engines hold (running and waiting). None: not measured
    concurrency: float | None = None

    @property
    def idle(self) -> bool:
        """No traffic at all: queue 0 and nothing served; TPOT then counts as 0."""
        return self.complete and self.requests == 0 and self.queue == 0

    def signals(self) -> dict:
        """What a decision record shows (the window's numbers, not its buckets)."""
        return {"running_replicas": self.running_replicas, "complete": self.complete, "requests": self.requests,
                "queue": self.queue, "tpot_s": self.tpot_s, "latency_p95_s": self.latency_p95_s,
                "queue_time_p90_s": self.queue_time_p90_s,
                **{k: v for k, v in (("ttft_p90_s", quantile(self.ttft, 0.9) if self.ttft else None),
                                     ("itl_p90_s", quantile(self.itl, 0.9) if self.itl else None),
                                     ("kv_usage", self.kv_usage), ("concurrency", self.concurrency))
                   if v is not None}}


def _pick(engines: list[Window], gateway: Window | None, field: str) -> Histogram | None:
    got = [getattr(w, field) for w in engines if w.ok and getattr(w, field) is not None]
    if got:
        return merge(got)
    return getattr(gateway, field) if gateway else None


def combine(at: float, running_replicas: int, engines: list[Window], gateway: Window | None) -> Sample:
    """The sample for ``at`` from every RUNNING replica's engine window and the gateways' window."""
    waiting = sum(w.waiting or 0.0 for w in engines if w.ok) + ((gateway.waiting or 0.0) if gateway else 0.0)
    serving = sum(w.running or 0.0 for w in engines if w.ok)
    if gateway and gateway.running is not None:
        serving = max(serving, gateway.running)
    latency = _pick(engines, gateway, "latency")
    tpot = _pick(engines, gateway, "tpot")
    eqt, gqt = _pick(engines, None, "queue_time"), gateway.queue_time if gateway else None
    ttft = _pick(engines, gateway, "ttft")
    kv = [min(1.0, w.kv_usage) for w in engines if w.ok and w.kv_usage is not None]
    q90 = [v for v in (quantile(h, 0.9) for h in (eqt, gqt) if h is not None) if v is not None]
    held = sum((w.running or 0.0) + (w.waiting or 0.0) for w in engines if w.ok)
    handed = (gateway.running or 0.0) if gateway else 0.0
    return Sample(at=at, running_replicas=running_replicas, complete=all(w.ok for w in engines),
                  requests=(latency.count if latency else 0.0) + serving,
                  queue=waiting / max(running_replicas, 1),
                  tpot_s=mean(tpot) if tpot else None,
                  latency_p95_s=quantile(latency, 0.95) if latency else None,
                  queue_time_p90_s=max(q90) if q90 else None,
                  finished=latency.count if latency else 0.0,
                  tpot_sum=tpot.sum if tpot else 0.0, tpot_count=tpot.count if tpot else 0.0,
                  latency=_kept(latency), queue_time=_kept(eqt), gateway_queue_time=_kept(gqt),
                  ttft=_kept(ttft), itl=_kept(tpot), kv_usage=sum(kv) / len(kv) if kv else None,
                  concurrency=((gateway.waiting or 0.0) if gateway else 0.0) + max(held, handed))


def _kept(h: Histogram | None) -> Histogram | None:
    return sparse(h) if h is not None and h.count > 0 else None
