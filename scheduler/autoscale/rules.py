"""Each rule's vote on the signal history: +1 (up, with a step), -1 (down) or 0 (hold), with the
arithmetic in ``why``. See config.py for the thresholds. A rule that lacks evidence holds."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.autoscale.config import LatencyP95, QueueTimeP90, QueueTpot
from scheduler.autoscale.signals import Sample


@dataclass(frozen=True)
class Vote:
    rule: str
    direction: int  # +1 up, -1 down, 0 hold
    step: int
    why: str


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 1000:.0f} ms"


def queue_tpot(r: QueueTpot, history: list[Sample], now: float) -> Vote:
    if not history:
        return Vote(r.kind, 0, 0, "no signals yet")
    s = history[-1]
    tpot = 0.0 if s.idle else s.tpot_s
    q = f"queue {s.queue:.1f}/replica, TPOT {_ms(tpot)}"
    if s.queue >= r.up_queue and tpot is not None and tpot > r.up_tpot_s:
        return Vote(r.kind, +1, r.up_step, f"{q}: >= {r.up_queue:g} and > {_ms(r.up_tpot_s)}")
    if s.complete and s.queue <= r.down_queue and tpot is not None and tpot < r.down_tpot_s:
        return Vote(r.kind, -1, 1, f"{q}: <= {r.down_queue:g} and < {_ms(r.down_tpot_s)}")
    return Vote(r.kind, 0, 0, q)


def _within(history: list[Sample], now: float, window: float) -> list[Sample]:
    return [s for s in history if now - window < s.at <= now]


def latency_p95(r: LatencyP95, history: list[Sample], now: float) -> Vote:
    up = [s for s in _within(history, now, r.up_window_s) if s.latency_p95_s is not None]
    if up and all(s.latency_p95_s > r.up_above_s for s in up):
        return Vote(r.kind, +1, r.up_step, f"P95 {_ms(up[-1].latency_p95_s)} > {_ms(r.up_above_s)} "
                                           f"over {r.up_window_s:g} s ({len(up)} samples)")
    down = _within(history, now, r.down_window_s)
    covered = _covers(history, now, r.down_window_s)
    quiet = all(s.complete and (s.idle or (s.latency_p95_s is not None and s.latency_p95_s < r.down_below_s))
                for s in down)
    if down and covered and quiet:
        return Vote(r.kind, -1, r.down_step, f"P95 < {_ms(r.down_below_s)} (or idle) over {r.down_window_s:g} s")
    last = history[-1].latency_p95_s if history else None
    return Vote(r.kind, 0, 0, f"P95 {_ms(last)}")


def _covers(history: list[Sample], now: float, window: float) -> bool:
    """The samples cover the last ``window`` seconds: one was taken at or before its start (each
    sample summarises the time since the one before it)."""
    return bool(history) and now - history[0].at >= window


def queue_time_p90(r: QueueTimeP90, history: list[Sample], now: float) -> Vote:
    last = history[-r.samples:]
    if len(last) < r.samples:
        return Vote(r.kind, 0, 0, f"{len(last)} of {r.samples} samples")
    p90 = [s.queue_time_p90_s for s in last]
    if all(v is not None and v > r.up_above_s for v in p90):
        return Vote(r.kind, +1, 1, f"queue-time P90 > {_ms(r.up_above_s)} in {r.samples} samples in a row "
                                   f"(last {_ms(p90[-1])})")
    if all(s.complete and (s.queue_time_p90_s or 0.0) < r.down_below_s for s in last):
        return Vote(r.kind, -1, 1, f"queue-time P90 < {_ms(r.down_below_s)} in {r.samples} samples")
    return Vote(r.kind, 0, 0, f"queue-time P90 {_ms(p90[-1])}")


VOTERS = {"queue_tpot": queue_tpot, "latency_p95": latency_p95, "queue_time_p90": queue_time_p90}
