"""The instance workflow's decisions (workflows/instance_machine.py: step) as a table: one row per
transition, the state before, the event, the action and what changed in the state.

Timings of every row: restart backoff base 1 s, cap 30 s; unreachable grace 300 s; a host's
schedule-to-start patience 15 s. ``T0`` is the event's time; ``ago(n)``: n seconds before it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from contracts.control import HostNews, PlacementPlan, PreemptNotice, Timings
from workflows import instance_machine as m

T = Timings(restart_base_s=1, restart_cap_s=30, unreachable_grace_s=300, host_schedule_to_start_s=15)
T0 = datetime(2025, 1, 1, 12, 0, tzinfo=timezone.utc)
PLAN = PlacementPlan(worker="h1", gpu_indexes=[0])
NOTICE = PreemptNotice(by="prod/chat-0", instance="chat-0", why="to reclaim prod's guarantee")


def ago(seconds: float) -> datetime:
    return T0 - timedelta(seconds=seconds)


HELD = {"plan": PLAN}  # placed on h1
STOP = {"stop_requested": True}
PREEMPTED = {"preempted": NOTICE}

# (state before, event, action, state changes)
ROWS = {
    # --- the top of the loop ("next": the last action is done) -----------------------------------------
    "stop ends the life": ({**HELD, **STOP}, {"kind": "next"}, {"kind": "teardown"}, {}),
    "stop wins over a preemption": ({**HELD, **STOP, **PREEMPTED}, {"kind": "next"}, {"kind": "teardown"}, {}),
    "preempted: give way": ({**HELD, **PREEMPTED}, {"kind": "next"}, {"kind": "give_way"}, {}),
    "give way before continue-as-new (it holds nothing after)":
        ({**HELD, **PREEMPTED}, {"kind": "next", "split": True}, {"kind": "give_way"}, {}),
    "a long history: continue-as-new": (HELD, {"kind": "next", "split": True}, {"kind": "continue_as_new"}, {}),
    "no placement: place it": ({}, {"kind": "next"}, {"kind": "place"}, {}),
    "placed: launch with the host's full patience (15 s)":
        (HELD, {"kind": "next"}, {"kind": "launch", "seconds": 15.0}, {}),
    "in an outage: launch quietly with the grace left, 300 - 100 = 200 s":
        ({**HELD, "unreachable_since": ago(100)}, {"kind": "next"},
         {"kind": "launch", "seconds": 200.0, "quiet": True}, {}),
    "in an outage, grace almost over: max(1, 300 - 299.5) = 1 s":
        ({**HELD, "unreachable_since": ago(299.5)}, {"kind": "next"},
         {"kind": "launch", "seconds": 1.0, "quiet": True}, {}),
    # --- placing ------------------------------------------------------------------------------------
    "placed: launch at once (no continue-as-new in between)":
        (HELD, {"kind": "placed", "split": True}, {"kind": "launch", "seconds": 15.0}, {}),
    "preempted while placing: give way first": ({**HELD, **PREEMPTED}, {"kind": "placed"}, {"kind": "give_way"}, {}),
    "preempted and stopped while placing: stop": ({**HELD, **PREEMPTED, **STOP}, {"kind": "placed"},
                                                  {"kind": "teardown"}, {}),
    # --- how a run on the host ended ---------------------------------------------------------------------
    "stopped for good": ({**HELD, **STOP}, {"kind": "stopped", "host": "h1", "reached": True},
                         {"kind": "teardown"}, {}),
    "stopped for a preemptor: give way": ({**HELD, **PREEMPTED}, {"kind": "stopped", "host": "h1", "reached": True},
                                          {"kind": "give_way"}, {}),
    "the spec's fault: give up, no restart": (HELD, {"kind": "invalid", "host": "h1", "why": "flag --x not allowed"},
                                              {"kind": "give_up", "reason": "refused by h1: flag --x not allowed"}, {}),
    "the ledger lost its booking: let go, the outage forgotten":
        ({**HELD, "unreachable_since": ago(10)}, {"kind": "unbooked", "host": "h1", "why": "no rows"},
         {"kind": "let_go", "reason": "h1 found no booking for it (no rows); placing it again"},
         {"unreachable_since": None}),
    "unreachable, first time: UNREACHABLE, the outage starts now":
        (HELD, {"kind": "unreachable", "host": "h1", "why": "timeout"},
         {"kind": "record", "state": "unreachable", "reason": "host h1 stopped answering: timeout"},
         {"unreachable_since": T0}),
    "unreachable again, 300 - 100 = 200 s of grace left: retry in min(1, 200) = 1 s":
        ({**HELD, "unreachable_since": ago(100)}, {"kind": "unreachable", "host": "h1", "why": "timeout"},
         {"kind": "retry", "seconds": 1.0}, {}),
    "unreachable again, 300 - 299.6 = 0.4 s left: retry in 0.4 s":
        ({**HELD, "unreachable_since": ago(299.6)}, {"kind": "unreachable", "host": "h1"},
         {"kind": "retry", "seconds": pytest.approx(0.4)}, {}),
    "unreachable for 300 - 300 = 0 s left: abandon the host":
        ({**HELD, "unreachable_since": ago(300)}, {"kind": "unreachable", "host": "h1"},
         {"kind": "abandon_host", "host": "h1"}, {"unreachable_since": None}),
    "the host answered, then was lost: a new outage, 1000 s ago forgotten":
        ({**HELD, "unreachable_since": ago(1000)}, {"kind": "unreachable", "host": "h1", "why": "lost", "reached": True},
         {"kind": "record", "state": "unreachable", "reason": "host h1 stopped answering: lost"},
         {"unreachable_since": T0}),
    "exited, restart 1: min(1 * 2^0, 30) = 1 s":
        ({**HELD, "pid": 42}, {"kind": "exited", "host": "h1", "why": "exit code 1", "reached": True},
         {"kind": "wait_restart", "state": "error", "reason": "exit code 1; restart 1 on h1 in 1 s", "seconds": 1.0},
         {"restarts": 1, "pid": None}),
    "exited, restart 3: min(1 * 2^2, 30) = 4 s":
        ({**HELD, "restarts": 2, "pid": 42}, {"kind": "exited", "host": "h1", "why": "killed", "reached": True},
         {"kind": "wait_restart", "state": "error", "reason": "killed; restart 3 on h1 in 4 s", "seconds": 4.0},
         {"restarts": 3, "pid": None}),
    "could not start, restart 6: min(1 * 2^5, 30) = 30 s":
        ({**HELD, "restarts": 5}, {"kind": "failed", "host": "h1", "why": "no such file"},
         {"kind": "wait_restart", "state": "error", "reason": "no such file; restart 6 on h1 in 30 s", "seconds": 30.0},
         {"restarts": 6}),
    "could not start after an outage: restart, the outage over":
        ({**HELD, "unreachable_since": ago(50)}, {"kind": "failed", "host": "h1", "why": "port taken"},
         {"kind": "wait_restart", "state": "error", "reason": "port taken; restart 1 on h1 in 1 s", "seconds": 1.0},
         {"restarts": 1, "unreachable_since": None}),
}


@pytest.mark.parametrize("before, event, action, changes", ROWS.values(), ids=ROWS.keys())
def test_step(before, event, action, changes):
    s = m.InstanceState(**before)
    was = s.model_dump()
    after, got = m.step(s, m.Event(now=T0, **event), T)
    assert got.model_dump(exclude_defaults=True) == action
    assert s.model_dump() == was  # pure: the state it was given is left as it was
    moved = {k: v for k, v in after.model_dump().items() if v != was[k]}
    assert moved == {k: (v.model_dump() if hasattr(v, "model_dump") else v) for k, v in changes.items()}


def test_restart_backoff_with_a_fractional_base():
    # restart 1 with base 0.5 s: min(0.5 * 2^0, 2) = 0.5 s, said as "0.5 s" (the :g format)
    s = m.InstanceState(plan=PLAN)
    after, got = m.step(s, m.Event(kind="exited", now=T0, host="h1", why="oom"),
                        Timings(restart_base_s=0.5, restart_cap_s=2))
    assert (got.kind, got.seconds, got.reason, after.restarts) == ("wait_restart", 0.5, "oom; restart 1 on h1 in 0.5 s", 1)


def test_the_state_keeps_what_signals_wrote():
    # a transition copies the state: the flags and the news that signals wrote stay in the new one
    s = m.InstanceState(plan=PLAN, woken=True, victims_stopped={"b-0"},
                        news={"h2": HostNews(host="h2", kind="restarted")})
    after, _ = m.step(s, m.Event(kind="exited", now=T0, host="h1", why="x"), T)
    assert (after.woken, after.victims_stopped, set(after.news), after.plan) == (True, {"b-0"}, {"h2"}, PLAN)
