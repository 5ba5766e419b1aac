"""bench/fleet_breakdown.py's steps: where one replica's way to RUNNING spends its time, read from
a recorded history's event times (tests/replay/histories, a real run's), and a trivial
one-activity workflow's shape built by hand."""

from __future__ import annotations

import json
import pathlib
from datetime import datetime, timezone

import pytest
from temporalio.api.enums.v1 import EventType as E
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory

from bench.fleet_breakdown import STEPS, step_table, steps

HIST = pathlib.Path(__file__).parent / "replay" / "histories" / "deploy__instance__web-0.json"


def _at(raw: dict, event_id: int) -> float:
    """An event's time from the history's JSON (RFC 3339, nanoseconds), in seconds."""
    stamp = raw["events"][event_id - 1]["eventTime"]  # 2026-12-06T21:05:51.550845615Z
    whole, frac = stamp.rstrip("Z").split(".")
    return datetime.fromisoformat(whole).replace(tzinfo=timezone.utc).timestamp() + float("0." + frac)


def test_a_replicas_steps_from_its_recorded_history():
    raw = HIST.read_text()
    got = steps(WorkflowHistory.from_json("instance/web-0", raw).events)
    h = json.loads(raw)
    kinds = [e["eventType"][len("EVENT_TYPE_"):] for e in h["events"][:12]]
    # the shape a replica's way to RUNNING has: 1 started, 3/4 its first task (decide and book, a
    # local activity), 7/8/9 the launch on its host, 11/12 the next task (RUNNING recorded)
    assert [kinds[i - 1] for i in (1, 3, 4, 7, 8, 9, 11, 12)] == [
        "WORKFLOW_EXECUTION_STARTED", "WORKFLOW_TASK_STARTED", "WORKFLOW_TASK_COMPLETED", "ACTIVITY_TASK_SCHEDULED",
        "ACTIVITY_TASK_STARTED", "ACTIVITY_TASK_COMPLETED", "WORKFLOW_TASK_STARTED", "WORKFLOW_TASK_COMPLETED"]
    want = {"queued for its first task": _at(h, 3) - _at(h, 1),
            "first task": _at(h, 4) - _at(h, 3),
            "activity queued on its worker": _at(h, 8) - _at(h, 7),
            "activity": _at(h, 9) - _at(h, 8),
            "queued for the next task": _at(h, 11) - _at(h, 9),
            "next task": _at(h, 12) - _at(h, 11)}
    assert list(got) == list(STEPS)
    for k, v in want.items():
        assert got[k] == pytest.approx(v, abs=1e-6), k


def _ev(kind, t: float) -> HistoryEvent:
    e = HistoryEvent(event_type=kind)
    e.event_time.FromNanoseconds(int(t * 1e9))
    return e


TRIVIAL = [(E.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED, 0.0), (E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, 0.0),
           (E.EVENT_TYPE_WORKFLOW_TASK_STARTED, 0.5), (E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, 0.6),
           (E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, 0.6), (E.EVENT_TYPE_ACTIVITY_TASK_STARTED, 0.7),
           (E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, 1.0), (E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, 1.0),
           (E.EVENT_TYPE_WORKFLOW_TASK_STARTED, 1.25), (E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, 1.5),
           (E.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, 1.5)]


@pytest.mark.parametrize("events, want", [
    # queued 0.5, first task 0.1, activity queued 0.1, activity 0.3, queued 0.25, next task 0.25
    (TRIVIAL, [0.5, 0.1, 0.1, 0.3, 0.25, 0.25]),
    # a workflow still waiting for its activity: no next task yet, no steps
    (TRIVIAL[:6], None),
    # a second workflow task before the activity ends (a signal) is not the task after it
    (TRIVIAL[:5] + [(E.EVENT_TYPE_WORKFLOW_TASK_STARTED, 0.65), (E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, 0.66)]
     + TRIVIAL[5:], [0.5, 0.1, 0.1, 0.3, 0.25, 0.25]),
])
def test_steps_of_a_one_activity_shape(events, want):
    got = steps([_ev(k, t) for k, t in events])
    if want is None:
        assert got is None
    else:
        assert [round(got[k], 6) for k in STEPS] == want


def test_the_table_prints_each_steps_p50_and_p90_beside_the_trivial():
    mine = [dict.fromkeys(STEPS, s) for s in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)]
    lines = step_table(mine, [dict.fromkeys(STEPS, 0.01)])
    assert "10 instances, 1 trivial workflows" in lines[0]
    # p50 of 0.1..1.0 s: the 6th (index 5) = 600 ms; p90: index 9 = 1000 ms; the trivial's 10 ms
    assert lines[1].split()[-4:] == ["600", "1000", "10", "10"]
