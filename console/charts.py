"""The autoscaler's chart on a deployment's page, as numbers for an inline SVG the template draws
(no chart library: the page fetches nothing, and every label is escaped by the template like any
other text). Pure: the autoscaler's steps (its workflow's ``autoscale`` query, the history
``gpuflow autoscale NAME`` prints) and ``now`` in, coordinates out.

Two step lines over time: the replicas the autoscaler wanted (its step's ``target``: the desired
count after the placement dry run, what it applied) and the replicas running when it decided
(``signals.running_replicas``). A step that voted up or down is a mark, titled with its rule, its
reason and the signals it saw (queue, TPOT, P95 latency), so the line's moves carry their why."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

WIDTH, HEIGHT = 640, 200
LEFT, RIGHT, TOP, BOTTOM = 36, 12, 10, 24  # margins: the y labels on the left, the x labels below


@dataclass(frozen=True)
class Mark:
    x: float
    y: float
    direction: str  # up | down
    title: str


@dataclass
class Chart:
    desired: str  # SVG polyline points "x,y x,y ..."
    running: str
    marks: list[Mark] = field(default_factory=list)
    y_ticks: list[tuple[float, int]] = field(default_factory=list)  # (y, replicas)
    x_ticks: list[tuple[float, float]] = field(default_factory=list)  # (x, seconds before now)
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    bottom: float = HEIGHT - BOTTOM
    right: float = WIDTH - RIGHT


def _ms(v: Any) -> str:
    return f"{v * 1000:.0f} ms" if isinstance(v, (int, float)) else "-"


def title(h: dict[str, Any]) -> str:
    """A step in words: 'up by queue: 2 -> 3 (queue 4.0, TPOT 12 ms, P95 310 ms)'."""
    s = h.get("signals") or {}
    queue = s.get("queue")
    seen = f"queue {queue:.1f}" if isinstance(queue, (int, float)) else "queue -"
    return (f"{h.get('direction', '-')} by {h.get('rule', '-')}: {h.get('current', '-')} -> {h.get('target', '-')} "
            f"({seen}, TPOT {_ms(s.get('tpot_s'))}, P95 {_ms(s.get('latency_p95_s'))}): {h.get('reason', '')}")


def _steps(points: list[tuple[float, float]], end: float) -> str:
    """A step line through ``points`` (each value holds until the next), carried on to ``end``."""
    out = []
    for i, (x, y) in enumerate(points):
        nxt = points[i + 1][0] if i + 1 < len(points) else end
        out += [f"{x:.1f},{y:.1f}", f"{nxt:.1f},{y:.1f}"]
    return " ".join(out)


def replicas_chart(history: list[dict[str, Any]], now: float) -> Chart | None:
    """The chart of ``history`` (oldest first; ``at`` in epoch seconds), or None without a step
    that has a count. x spans the first step to ``now``; y spans 0 to the largest count (at least 1)."""
    steps = [h for h in history if isinstance(h.get("at"), (int, float)) and isinstance(h.get("target"), int)]
    if not steps:
        return None
    t0 = steps[0]["at"]
    span = max(now - t0, 1.0)
    top = max(1, *(max(h["target"], int((h.get("signals") or {}).get("running_replicas") or 0)) for h in steps))
    x0, x1, y0, y1 = LEFT, WIDTH - RIGHT, HEIGHT - BOTTOM, TOP

    def x(t: float) -> float:
        return x0 + (x1 - x0) * (min(t, now) - t0) / span

    def y(n: float) -> float:
        return y0 - (y0 - y1) * n / top

    desired = [(x(h["at"]), y(h["target"])) for h in steps]
    running = [(x(h["at"]), y(int((h.get("signals") or {}).get("running_replicas") or 0))) for h in steps]
    marks = [Mark(x=x(h["at"]), y=y(h["target"]), direction=h["direction"], title=title(h))
             for h in steps if h.get("direction") in ("up", "down")]
    every = max(1, -(-top // 4))  # at most 5 labels: 0, every, 2 x every, ...
    y_ticks = [(y(n), n) for n in range(0, top + 1, every)]
    x_ticks = [(x(t0 + span * k / 4), span * (4 - k) / 4) for k in range(5)]
    return Chart(desired=_steps(desired, x(now)), running=_steps(running, x(now)), marks=marks,
                 y_ticks=y_ticks, x_ticks=x_ticks)
