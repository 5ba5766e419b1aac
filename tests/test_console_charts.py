"""The autoscaler's chart on a deployment's page (console/charts.py): where its lines and
marks fall, and the words each mark carries. The SVG is 640 x 200 with margins left 36, right 12,
top 10, bottom 24: x runs from 36 to 628 (592 wide), y from 176 (0 replicas) up to 10."""

from __future__ import annotations

import pytest

from console.charts import replicas_chart, title


def step(at, target, running, direction="hold", rule="-", **signals):
    return {"at": at, "current": running, "target": target, "direction": direction, "rule": rule,
            "reason": f"{rule} said so", "signals": {"running_replicas": running, **signals}}


def test_no_steps_no_chart():
    assert replicas_chart([], 100.0) is None
    assert replicas_chart([{"at": 1.0, "direction": "error", "reason": "boom"}], 100.0) is None  # no count


@pytest.mark.parametrize("history, now, desired, running", [
    # one step at t=0 wanting 2 with 1 running, now t=100: top = 2 replicas
    # desired: y = 176 - 166 x 2/2 = 10, from x 36 to x 628; running: y = 176 - 166 x 1/2 = 93
    ([step(0.0, 2, 1)], 100.0, "36.0,10.0 628.0,10.0", "36.0,93.0 628.0,93.0"),
    # steps at t=0 (1 wanted, 1 running) and t=50 (2 wanted, 1 running), now 100:
    # t=50 is x = 36 + 592 x 50/100 = 332; the desired line steps from y 93 up to y 10 there
    ([step(0.0, 1, 1), step(50.0, 2, 1, "up", "queue")], 100.0,
     "36.0,93.0 332.0,93.0 332.0,10.0 628.0,10.0", "36.0,93.0 332.0,93.0 332.0,93.0 628.0,93.0"),
    # scaled to zero: 0 replicas sit on the axis (y 176); the y range is at least 1 replica
    ([step(0.0, 0, 0)], 10.0, "36.0,176.0 628.0,176.0", "36.0,176.0 628.0,176.0"),
])
def test_lines(history, now, desired, running):
    c = replicas_chart(history, now)
    assert (c.desired, c.running) == (desired, running)


def test_marks_ticks_and_titles():
    h = [step(0.0, 1, 1), step(30.0, 3, 1, "up", "queue", queue=4.0, tpot_s=0.012, latency_p95_s=0.31),
         step(60.0, 3, 3), step(90.0, 2, 3, "down", "idle")]
    c = replicas_chart(h, 120.0)
    # two marks: the up at t=30 (x = 36 + 592 x 30/120 = 184, y for 3 of 3 = 10), the down at t=90
    # (x = 36 + 592 x 90/120 = 480, y for 2 of 3 = 176 - 166 x 2/3 = 65.33)
    assert [(m.direction, m.x, round(m.y, 2)) for m in c.marks] == [("up", 184.0, 10.0), ("down", 480.0, 65.33)]
    assert c.marks[0].title == "up by queue: 1 -> 3 (queue 4.0, TPOT 12 ms, P95 310 ms): queue said so"
    # y labels 0..3, every 1 (at most 5 labels: every = ceil(3 / 4) = 1); x labels 120, 90, 60, 30, 0 s before now
    assert [n for _, n in c.y_ticks] == [0, 1, 2, 3]
    assert [before for _, before in c.x_ticks] == [120.0, 90.0, 60.0, 30.0, 0.0]


def test_title_without_signals():
    assert title({"direction": "up", "rule": "cold_start", "current": 0, "target": 1, "reason": "a request waits"}) \
        == "up by cold_start: 0 -> 1 (queue -, TPOT -, P95 -): a request waits"
