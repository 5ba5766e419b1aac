"""Each rule's vote on the signal history: +1 (up, with a step), -1 (down) or 0 (hold), with the
arithmetic in ``why``. See config.py for the thresholds. A rule that lacks evidence holds.

Every rule asks the same three questions, in order, of windows of samples taken after the last
scale step (evidence.py), in the manner of Knative's KPA:

1. **Burst** (panic window, ``panic_window_s``, at least one interval): its requests reach
   ``min_samples`` and its signal is at least ``panic_threshold`` (2x) the up threshold: up.
2. **Stable** (``stable_window_s``, 60 s, or the rule's own window): covered, with at least
   ``min_samples`` requests, and above the up threshold: up.
3. **Down** (the stable or the rule's down window): covered, every scrape complete, and either no
   traffic at all (idle), or at least ``min_samples`` requests below the down threshold, or fewer
   than ``min_samples`` requests none of which waited for a replica (too little traffic to measure,
   and nothing queued: this is the only vote taken on fewer, and it is never up).

Otherwise it holds, saying which evidence is missing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from scheduler.autoscale.config import Itl, KvUsage, LatencyP95, Queue, QueueTimeP90, QueueTpot, Tpot, Ttft
from scheduler.autoscale.evidence import Evidence, evidence
from scheduler.autoscale.signals import Sample


@dataclass(frozen=True)
class Vote:
    rule: str
    direction: int  # +1 up, -1 down, 0 hold
    step: int
    why: str


@dataclass(frozen=True)
class Windows:
    """The block's windows (config.Autoscaling) and the last step, which no window reaches past."""

    interval_s: float = 15
    stable_s: float = 60
    panic_s: float = 6
    panic_threshold: float = 2.0
    last_step_at: float | None = None
    running: int = 0  # RUNNING replicas now: what a computed desired count (kpa.py) is a step from

    def stable(self, own: float | None = None) -> float:
        return max(own or self.stable_s, self.interval_s)

    def panic(self) -> float:
        return max(self.panic_s, self.interval_s)


@dataclass(frozen=True)
class Test:
    """One rule's signal read from a window: ``over(ev, f)`` (above f times the up threshold),
    ``under(ev)`` (below the down threshold) and ``show(ev)`` (the numbers, for ``why``)."""

    over: Callable[[Evidence, float], bool]
    under: Callable[[Evidence], bool]
    show: Callable[[Evidence], str]
    up: str  # the up threshold, in words
    down: str


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 1000:.0f} ms"


def judge(kind: str, t: Test, min_samples: int, up_step: int, down_step: int, history: list[Sample], now: float,
          w: Windows, up_window: float | None = None, down_window: float | None = None) -> Vote:
    panic = evidence(history, now, w.panic(), w.last_step_at)
    if panic.covered and panic.requests >= min_samples and t.over(panic, w.panic_threshold):
        return Vote(kind, +1, up_step, f"burst: {t.show(panic)} >= {w.panic_threshold:g} x ({t.up}) over the last "
                                       f"{panic.span:g} s ({panic.requests:g} requests)")
    up = evidence(history, now, w.stable(up_window), w.last_step_at)
    if up.covered and up.requests >= min_samples and t.over(up, 1.0):
        return Vote(kind, +1, up_step, f"{t.show(up)}: {t.up} over {up.span:g} s ({up.requests:g} requests)")
    down = evidence(history, now, w.stable(down_window), w.last_step_at)
    if down.covered and down.complete:
        if down.idle:
            return Vote(kind, -1, down_step, f"no traffic over {down.span:g} s")
        if down.requests >= min_samples and t.under(down):
            return Vote(kind, -1, down_step, f"{t.show(down)}: {t.down} over {down.span:g} s "
                                             f"({down.requests:g} requests)")
        if down.requests < min_samples and down.quiet:
            return Vote(kind, -1, down_step, f"{down.requests:g} < {min_samples} requests over {down.span:g} s, "
                                             f"none waiting")
    if not up.covered:
        after = "" if w.last_step_at is None else " after the last step"
        return Vote(kind, 0, 0, f"signals{after} cover {up.covers_s:.0f} of {up.span:g} s")
    if up.requests < min_samples:
        return Vote(kind, 0, 0, f"{up.requests:g} of {min_samples} requests over {up.span:g} s: too few to judge")
    if not down.covered:
        return Vote(kind, 0, 0, f"{t.show(up)}; down window: signals cover {down.covers_s:.0f} of {down.span:g} s")
    return Vote(kind, 0, 0, t.show(up))


def queue_tpot(r: QueueTpot, history: list[Sample], now: float, w: Windows) -> Vote:
    def tpot(ev: Evidence) -> float | None:
        return 0.0 if ev.idle else ev.tpot_s

    t = Test(over=lambda ev, f: ev.queue >= f * r.up_queue and (tpot(ev) or 0.0) > r.up_tpot_s,
             under=lambda ev: ev.queue <= r.down_queue and tpot(ev) is not None and tpot(ev) < r.down_tpot_s,
             show=lambda ev: f"queue {ev.queue:.1f}/replica, TPOT {_ms(tpot(ev))}",
             up=f">= {r.up_queue:g} and > {_ms(r.up_tpot_s)}", down=f"<= {r.down_queue:g} and < {_ms(r.down_tpot_s)}")
    return judge(r.kind, t, r.min_samples, r.up_step, 1, history, now, w)


def latency_p95(r: LatencyP95, history: list[Sample], now: float, w: Windows) -> Vote:
    def p95(ev: Evidence) -> float | None:
        return ev.latency(0.95)

    t = Test(over=lambda ev, f: (v := p95(ev)) is not None and v > r.up_above_s and v >= f * r.up_above_s,
             under=lambda ev: (v := p95(ev)) is not None and v < r.down_below_s,
             show=lambda ev: f"P95 {_ms(p95(ev))}", up=f"> {_ms(r.up_above_s)}", down=f"< {_ms(r.down_below_s)}")
    return judge(r.kind, t, r.min_samples, r.up_step, r.down_step, history, now, w, r.up_window_s, r.down_window_s)


def queue_time_p90(r: QueueTimeP90, history: list[Sample], now: float, w: Windows) -> Vote:
    def p90(ev: Evidence) -> float | None:
        return ev.queue_time(0.9)

    own = r.samples * w.interval_s if r.samples else None
    t = Test(over=lambda ev, f: (v := p90(ev)) is not None and v > r.up_above_s and v >= f * r.up_above_s,
             under=lambda ev: (p90(ev) or 0.0) < r.down_below_s,
             show=lambda ev: f"queue-time P90 {_ms(p90(ev))}", up=f"> {_ms(r.up_above_s)}",
             down=f"< {_ms(r.down_below_s)}")
    return judge(r.kind, t, r.min_samples, 1, 1, history, now, w, own, own)


def _above(read: Callable[[Evidence], float | None], up: float):
    """Above ``up`` and at least f times it (f: 1 in the stable window, the panic threshold in a burst)."""
    return lambda ev, f: (v := read(ev)) is not None and v > up and v >= f * up


def ttft(r: Ttft, history: list[Sample], now: float, w: Windows) -> Vote:
    def q(ev: Evidence) -> float | None:
        return ev.ttft(r.quantile)

    p = f"TTFT P{r.quantile * 100:g}"
    t = Test(over=_above(q, r.up_above_s), under=lambda ev: (v := q(ev)) is not None and v < r.down_below_s,
             show=lambda ev: f"{p} {_ms(q(ev))}", up=f"> {_ms(r.up_above_s)}", down=f"< {_ms(r.down_below_s)}")
    return judge(r.kind, t, r.min_samples, r.up_step, 1, history, now, w)


def itl(r: Itl, history: list[Sample], now: float, w: Windows) -> Vote:
    def q(ev: Evidence) -> float | None:
        return ev.itl(r.quantile)

    p = f"ITL P{r.quantile * 100:g}"
    t = Test(over=_above(q, r.up_above_s), under=lambda ev: (v := q(ev)) is not None and v < r.down_below_s,
             show=lambda ev: f"{p} {_ms(q(ev))}", up=f"> {_ms(r.up_above_s)}", down=f"< {_ms(r.down_below_s)}")
    return judge(r.kind, t, r.min_samples, r.up_step, 1, history, now, w)


def tpot(r: Tpot, history: list[Sample], now: float, w: Windows) -> Vote:
    def mean(ev: Evidence) -> float | None:
        return ev.tpot_s

    t = Test(over=_above(mean, r.up_above_s), under=lambda ev: (v := mean(ev)) is not None and v < r.down_below_s,
             show=lambda ev: f"TPOT {_ms(mean(ev))}", up=f"> {_ms(r.up_above_s)}", down=f"< {_ms(r.down_below_s)}")
    return judge(r.kind, t, r.min_samples, r.up_step, 1, history, now, w)


def kv_usage(r: KvUsage, history: list[Sample], now: float, w: Windows) -> Vote:
    """A burst would need panic_threshold x up_above (1.7 at the defaults): KV usage never shows
    one, so it scales on the stable window only."""
    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.0%}"

    t = Test(over=_above(lambda ev: ev.kv_usage, r.up_above),
             under=lambda ev: ev.kv_usage is not None and ev.kv_usage < r.down_below,
             show=lambda ev: f"KV usage {pct(ev.kv_usage)}", up=f"> {pct(r.up_above)}", down=f"< {pct(r.down_below)}")
    return judge(r.kind, t, r.min_samples, r.up_step, 1, history, now, w)


def queue(r: Queue, history: list[Sample], now: float, w: Windows) -> Vote:
    t = Test(over=lambda ev, f: ev.queue >= f * r.up_queue, under=lambda ev: ev.queue <= r.down_queue,
             show=lambda ev: f"queue {ev.queue:.1f}/replica", up=f">= {r.up_queue:g}", down=f"<= {r.down_queue:g}")
    return judge(r.kind, t, r.min_samples, r.up_step, 1, history, now, w)


VOTERS = {"queue_tpot": queue_tpot, "latency_p95": latency_p95, "queue_time_p90": queue_time_p90,
          "ttft": ttft, "itl": itl, "tpot": tpot, "kv_usage": kv_usage, "queue": queue}
