"""What a window of samples shows, taken together: the question a rule asks before it votes.

A window is the last ``span`` seconds, ``(now - span, now]``. It is **covered** when a sample was
taken at or before its start (each sample summarises the time since the one before) and no scale
step happened inside it: after a step, the samples before it describe a deployment that no longer
exists, so a step is never taken twice on the same samples. Inside a window, as
``histogram_quantile(q, sum(increase(bucket[span])))`` would: the samples' histograms are merged
before a quantile is taken, TPOT is the gaps' summed seconds over their count, and the queue per
replica is the samples' mean (Knative averages over its window the same way).

``requests`` counts what the window saw: those that finished in it, plus those in flight and
waiting at its end."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.autoscale.histogram import merge, quantile
from scheduler.autoscale.signals import Sample


@dataclass(frozen=True)
class Evidence:
    span: float
    samples: tuple[Sample, ...]
    covered: bool  # the samples reach back to the window's start, and no step happened inside it
    covers_s: float  # how much of the span they do cover

    @property
    def requests(self) -> float:
        if not self.samples:
            return 0.0
        last = self.samples[-1]
        in_flight = max(0.0, last.requests - last.finished)
        return sum(s.finished for s in self.samples) + in_flight + last.queue * max(last.running_replicas, 1)

    @property
    def complete(self) -> bool:
        return all(s.complete for s in self.samples)

    @property
    def idle(self) -> bool:
        """No traffic at all in the window."""
        return bool(self.samples) and all(s.idle for s in self.samples)

    @property
    def quiet(self) -> bool:
        """Nothing waited for a replica at any sample."""
        return all(s.queue == 0 for s in self.samples)

    @property
    def queue(self) -> float:
        return sum(s.queue for s in self.samples) / len(self.samples) if self.samples else 0.0

    @property
    def concurrency(self) -> float:
        """The mean of the samples' requests in the system (a sample from before the field: its in
        flight plus its waiting), as Knative averages concurrency over its window."""
        got = [in_system(s) for s in self.samples]
        return sum(got) / len(got) if got else 0.0

    @property
    def tpot_s(self) -> float | None:
        n = sum(s.tpot_count for s in self.samples)
        return sum(s.tpot_sum for s in self.samples) / n if n > 0 else None

    def latency(self, q: float) -> float | None:
        return quantile(merge([s.latency for s in self.samples if s.latency is not None]), q)

    def ttft(self, q: float) -> float | None:
        return quantile(merge([s.ttft for s in self.samples if s.ttft is not None]), q)

    def itl(self, q: float) -> float | None:
        return quantile(merge([s.itl for s in self.samples if s.itl is not None]), q)

    @property
    def kv_usage(self) -> float | None:
        """The mean of the samples' KV-cache usage (those that have one)."""
        got = [s.kv_usage for s in self.samples if s.kv_usage is not None]
        return sum(got) / len(got) if got else None

    def queue_time(self, q: float) -> float | None:
        """The larger of the engines' and the gateways' q-quantile of queueing time."""
        got = [quantile(merge([getattr(s, f) for s in self.samples if getattr(s, f) is not None]), q)
               for f in ("queue_time", "gateway_queue_time")]
        got = [v for v in got if v is not None]
        return max(got) if got else None


def in_system(s: Sample) -> float:
    """The requests in the system at a sample: its ``concurrency``, or (a sample from before the
    field) its in flight plus its waiting."""
    if s.concurrency is not None:
        return s.concurrency
    return max(0.0, s.requests - s.finished) + s.queue * max(s.running_replicas, 1)


def arrivals_per_s(history: list[Sample], ev: Evidence) -> float | None:
    """Requests that arrived per second over the window: what finished in it plus what the system
    gained (in system at its end less at the sample before it), over the seconds from that sample
    to its last. None without a sample before the window (then it is not covered either)."""
    if not ev.samples:
        return None
    first, last = ev.samples[0], ev.samples[-1]
    before = [s for s in history if s.at < first.at]
    if not before or last.at <= before[-1].at:
        return None
    came = sum(s.finished for s in ev.samples) + in_system(last) - in_system(before[-1])
    return max(0.0, came) / (last.at - before[-1].at)


def evidence(history: list[Sample], now: float, span: float, last_step_at: float | None) -> Evidence:
    """The samples of ``(now - span, now]`` that were taken after the last step."""
    start = now - span
    floor = start if last_step_at is None else max(start, last_step_at)
    within = tuple(s for s in history if floor < s.at <= now)
    first = history[0].at if history else now
    reach = now - max(first, floor)
    covered = bool(within) and first <= start and (last_step_at is None or last_step_at <= start)
    return Evidence(span=span, samples=within, covered=covered, covers_s=max(0.0, min(reach, span)))
