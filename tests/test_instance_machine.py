"""The instance workflow's decisions (workflows/instance_machine.py: step, placing's rows in
workflows/place_machine.py) as a table: one row per transition, the state before, the event, the
action and what changed in the state.

Timings of every row: restart backoff base 1 s, cap 30 s (an estimate the hub did not answer waits
the same); unreachable grace 300 s; a host's schedule-to-start patience 15 s; the PENDING recheck
of a path no host has 600 s. ``T0`` is the event's time; ``ago(n)``: n seconds before it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from contracts.control import (DecisionRecord, EstimateRecord, HostNews, PlacementPlan, PreemptNotice, RequestSummary,
                               Timings, Victim)
from contracts.estimate_inputs import EstimateInputs
from workflows import instance_machine as m
from workflows import instance_state as k
from workflows.instance_state import Placing

T = Timings(restart_base_s=1, restart_cap_s=30, unreachable_grace_s=300, host_schedule_to_start_s=15,
            pending_recheck_s=600)
T0 = datetime(2025, 1, 1, 12, 0, tzinfo=timezone.utc)
PLAN = PlacementPlan(worker="h1", gpu_indexes=[0])
NOTICE = PreemptNotice(by="prod/chat-0", instance="chat-0", why="to reclaim prod's guarantee")


def ago(seconds: float) -> datetime:
    return T0 - timedelta(seconds=seconds)


HELD = {"plan": PLAN}  # placed on h1
QUICK = {"quick": True}  # the spec states its resources: no estimate, decided by a local activity, booked STARTING
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
    "no placement, the spec states its resources: decide at once, as a local activity, booked STARTING":
        (QUICK, {"kind": "next"}, {"kind": "decide", "then": "starting", "local": True}, {"placing": Placing()}),
    "no placement, costed from files: ANALYZING first": ({}, {"kind": "next"}, {"kind": "record", "state": "analyzing"},
                                                         {"placing": Placing()}),
    "a new run without a placement: place it": (QUICK, {"kind": "started"},
                                                {"kind": "decide", "then": "starting", "local": True},
                                                {"placing": Placing()}),
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
    "stopped while placing: stop, nothing launched": ({**HELD, **STOP}, {"kind": "placed"}, {"kind": "teardown"}, {}),
    # --- a placement carried across continue-as-new ---------------------------------------------------
    "a new run with a placement: ask the ledger first": (HELD, {"kind": "started"}, {"kind": "check_held"}, {}),
    "the ledger holds exactly it: launch": (HELD, {"kind": "held"}, {"kind": "launch", "seconds": 15.0}, {}),
    "the ledger does not: disown it, placed again":
        (HELD, {"kind": "held", "why": "the ledger holds nothing for it"},
         {"kind": "disown", "reason": "the placement its input carried is not the ledger's (the ledger holds nothing "
                                      "for it); placing it again"}, {}),
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
         {"kind": "wait", "state": "error", "reason": "exit code 1; restart 1 on h1 in 1 s", "seconds": 1.0,
          "until": "preempted"},
         {"restarts": 1, "pid": None}),
    "exited, restart 3: min(1 * 2^2, 30) = 4 s":
        ({**HELD, "restarts": 2, "pid": 42}, {"kind": "exited", "host": "h1", "why": "killed", "reached": True},
         {"kind": "wait", "state": "error", "reason": "killed; restart 3 on h1 in 4 s", "seconds": 4.0,
          "until": "preempted"},
         {"restarts": 3, "pid": None}),
    "exited out of GPU memory: released and placed again at once (its claim may have grown), no backoff":
        ({**HELD, "pid": 42}, {"kind": "exited", "host": "h1", "why": "exited with code -9: CUDA out of memory",
                               "reached": True},
         {"kind": "let_go", "reason": "exited with code -9: CUDA out of memory; out of GPU memory: its booking "
                                      "released, placing it again"},
         {"restarts": 1, "pid": None}),
    "out of GPU memory again (restart 3): placed again after the backoff, min(1 * 2^(2-1), 30) = 2 s":
        ({**HELD, "restarts": 2, "pid": 42}, {"kind": "exited", "host": "h1", "why": "CUDA out of memory",
                                              "reached": True},
         {"kind": "let_go", "seconds": 2.0, "reason": "CUDA out of memory; out of GPU memory: its booking released, "
                                                      "placing it again in 2 s (restart 3)"},
         {"restarts": 3, "pid": None}),
    "failed to start out of memory: a restart as before (only a run that OOMs is placed again)":
        ({**HELD}, {"kind": "failed", "host": "h1", "why": "CUDA out of memory"},
         {"kind": "wait", "state": "error", "reason": "CUDA out of memory; restart 1 on h1 in 1 s", "seconds": 1.0,
          "until": "preempted"},
         {"restarts": 1}),
    "could not start, restart 6: min(1 * 2^5, 30) = 30 s":
        ({**HELD, "restarts": 5}, {"kind": "failed", "host": "h1", "why": "no such file"},
         {"kind": "wait", "state": "error", "reason": "no such file; restart 6 on h1 in 30 s", "seconds": 30.0,
          "until": "preempted"},
         {"restarts": 6}),
    "could not start after an outage: restart, the outage over":
        ({**HELD, "unreachable_since": ago(50)}, {"kind": "failed", "host": "h1", "why": "port taken"},
         {"kind": "wait", "state": "error", "reason": "port taken; restart 1 on h1 in 1 s", "seconds": 1.0,
          "until": "preempted"},
         {"restarts": 1, "unreachable_since": None}),
}


# --- placing (workflows/place_machine.py): each call an action, each result an event ------------------------
FILES = {"reads_files": True}  # costed from a local path: read on the hosts, then estimated
READ = EstimateInputs(path="/models/m.gguf", kind="gguf", worker="h1")
EST = EstimateRecord(model="m", request=RequestSummary(kind="flat", vram=20 * 2**30), summary="20.0 GiB VRAM")
FITS_NOT = "h1: 10.0 GiB of VRAM free, it needs 20.0 GiB"
QUOTA = "quota: tenant poc uses 2 of its 2 GPUs (this replica needs 1)"
D_BOOKED = DecisionRecord(scheduled=True, plan=PLAN, strategy="binpack", score=87.5)
D_PENDING = DecisionRecord(scheduled=False, reasons=[FITS_NOT, "h2: not READY"], decisive=1)
D_QUOTA = DecisionRecord(scheduled=False, reasons=[QUOTA, FITS_NOT], decisive=1, quota=QUOTA)
HOLD = "held back while poc-0 (ahead of it in the queue) takes the capacity freed now"
D_HELD = DecisionRecord(scheduled=False, reasons=[HOLD], decisive=1, held=HOLD)  # the policy placed it; the queue held it
VICTIMS = [Victim(name=n, deployment="dev", tenant="dev", plan=PLAN) for n in ("dev-1", "dev-0")]
D_PREEMPT = DecisionRecord(scheduled=True, plan=PLAN, strategy="binpack", score=50.0, tenant="prod", victims=VICTIMS,
                           preempt_why="to reclaim prod's guarantee")
WHY = "preempting dev-1, dev-0 to reclaim prod's guarantee"  # the victims in the decision's order
PLACING_NOW = {"placing": Placing()}
PREEMPTING = {**QUICK, **HELD, "decision": D_PREEMPT,
              "placing": Placing(estimate=EST, victims=["dev-0", "dev-1"], why=WHY)}  # booked, both told

PLACING = {
    # --- reading the local path and estimating ------------------------------------------------------
    "ANALYZING recorded, costed from a local path: the hosts read it (a wake from now on counts)":
        ({**FILES, **PLACING_NOW, "woken": True}, {"kind": "next"}, {"kind": "read_model"}, {"woken": False}),
    "read: estimate it": ({**FILES, **PLACING_NOW}, {"kind": "read", "inputs": READ}, {"kind": "estimate"},
                          {"placing": Placing(inputs=READ)}),
    "no host has the path: PENDING with each host's answer until woken, or 600 s":
        ({**FILES, **PLACING_NOW}, {"kind": "path_missing", "why": "model path '/m' is on no host: h1: missing"},
         {"kind": "wait", "state": "pending", "reason": "model path '/m' is on no host: h1: missing", "seconds": 600.0,
          "until": "woken"}, {}),
    "woken (or 600 s passed) with the path missing: read again":
        ({**FILES, **PLACING_NOW}, {"kind": "woken"}, {"kind": "read_model"}, {}),
    "the file there is no model: ERROR until a new spec":
        ({**FILES, **PLACING_NOW}, {"kind": "model_bad", "why": "bad magic"},
         {"kind": "give_up", "reason": "cannot estimate the model: bad magic"}, {"placing": None}),
    "the hub did not answer, try 1: ERROR, again in min(1 * 2^0, 30) = 1 s":
        (PLACING_NOW, {"kind": "estimate_failed", "why": "timed out", "retry": True},
         {"kind": "wait", "state": "error", "reason": "cannot estimate the model: timed out; trying again in 1 s",
          "seconds": 1.0}, {"placing": Placing(tries=1)}),
    "the hub did not answer, try 4: min(1 * 2^3, 30) = 8 s":
        ({"placing": Placing(tries=3)}, {"kind": "estimate_failed", "why": "timed out", "retry": True},
         {"kind": "wait", "state": "error", "reason": "cannot estimate the model: timed out; trying again in 8 s",
          "seconds": 8.0}, {"placing": Placing(tries=4)}),
    "the hub did not answer, try 7: min(1 * 2^6, 30) = 30 s":
        ({"placing": Placing(tries=6)}, {"kind": "estimate_failed", "why": "timed out", "retry": True},
         {"kind": "wait", "state": "error", "reason": "cannot estimate the model: timed out; trying again in 30 s",
          "seconds": 30.0}, {"placing": Placing(tries=7)}),
    "the backoff is over: estimate again": ({"placing": Placing(tries=1)}, {"kind": "next"}, {"kind": "estimate"}, {}),
    "the model itself is wrong: ERROR until a new spec":
        (PLACING_NOW, {"kind": "estimate_failed", "why": "not a GGUF file"},
         {"kind": "give_up", "reason": "cannot estimate the model: not a GGUF file"}, {"placing": None}),
    "stopped while estimating (or in its backoff): stop": ({**STOP, **PLACING_NOW}, {"kind": "next"},
                                                           {"kind": "teardown"}, {}),
    # --- deciding and booking -----------------------------------------------------------------------
    "estimated (the count of tries starts over): decide by a regular activity, booked SCHEDULED":
        ({"placing": Placing(inputs=READ, tries=2)}, {"kind": "estimated", "estimate": EST},
         {"kind": "decide", "then": "scheduled"}, {"placing": Placing(inputs=READ, estimate=EST)}),
    "a hub source that states its resources: a local activity, booked SCHEDULED (the download first)":
        ({**QUICK, "hub": True, **PLACING_NOW}, {"kind": "next"},
         {"kind": "decide", "then": "scheduled", "local": True}, {}),
    "a preemption notice while placing waits until the placement is done":
        ({**QUICK, **PREEMPTED, **PLACING_NOW}, {"kind": "next"}, {"kind": "decide", "then": "starting", "local": True},
         {}),
    "a long history while placing: continue-as-new waits too":
        ({**QUICK, **PLACING_NOW}, {"kind": "next", "split": True},
         {"kind": "decide", "then": "starting", "local": True}, {}),
    "booked, launched in this task: follow the row the booking wrote STARTING":
        ({**QUICK, **PLACING_NOW}, {"kind": "decided", "decision": D_BOOKED, "plan": PLAN, "estimate": EST},
         {"kind": "booked", "state": "starting"}, {"plan": PLAN, "decision": D_BOOKED, "placing": None}),
    "booked after an estimate: SCHEDULED, with strategy and score":
        ({"placing": Placing(estimate=EST)}, {"kind": "decided", "decision": D_BOOKED, "plan": PLAN},
         {"kind": "booked", "state": "scheduled", "reason": "binpack: score 87.5"},
         {"plan": PLAN, "decision": D_BOOKED, "placing": None}),
    "booked after a preemption: the preemptor no longer shown":
        ({**QUICK, "preempted_why": NOTICE.reason, **PLACING_NOW},
         {"kind": "decided", "decision": D_BOOKED, "plan": PLAN}, {"kind": "booked", "state": "starting"},
         {"plan": PLAN, "decision": D_BOOKED, "placing": None, "preempted_why": ""}),
    "does not fit: PENDING with the decisive reason (1 of 2) until woken":
        ({**QUICK, **PLACING_NOW}, {"kind": "decided", "decision": D_PENDING, "estimate": EST},
         {"kind": "wait", "state": "pending", "reason": f"unschedulable: {FITS_NOT}", "until": "woken",
          "row": {"request": "20.0 GiB VRAM", "reasons": [FITS_NOT, "h2: not READY"]}},
         {"decision": D_PENDING, "placing": Placing(estimate=EST)}),
    "does not fit after it was preempted: the preemptor named first":
        ({**QUICK, "preempted_why": NOTICE.reason, **PLACING_NOW},
         {"kind": "decided", "decision": D_PENDING, "estimate": EST},
         {"kind": "wait", "state": "pending", "until": "woken",
          "reason": f"preempted by prod/chat-0 to reclaim prod's guarantee; unschedulable: {FITS_NOT}",
          "row": {"request": "20.0 GiB VRAM", "reasons": [FITS_NOT, "h2: not READY"]}},
         {"decision": D_PENDING, "placing": Placing(estimate=EST)}),
    "over a quota: the quota leads, as it is (min(3, 1) = 1 reason)":
        ({**QUICK, **PLACING_NOW}, {"kind": "decided", "decision": D_QUOTA, "estimate": EST},
         {"kind": "wait", "state": "pending", "reason": QUOTA, "until": "woken",
          "row": {"request": "20.0 GiB VRAM", "reasons": [QUOTA, FITS_NOT]}},
         {"decision": D_QUOTA, "placing": Placing(estimate=EST)}),
    "held back by the queue: PENDING with the hold, deciding again in 10 s if no wake comes first":
        ({**QUICK, **PLACING_NOW}, {"kind": "decided", "decision": D_HELD, "estimate": EST},
         {"kind": "wait", "state": "pending", "reason": HOLD, "until": "woken", "seconds": 10.0,
          "row": {"request": "20.0 GiB VRAM", "reasons": [HOLD]}},
         {"decision": D_HELD, "placing": Placing(estimate=EST)}),
    "woken: decide again": ({**QUICK, "woken": True, "placing": Placing(estimate=EST)}, {"kind": "woken"},
                            {"kind": "decide", "then": "starting", "local": True}, {"woken": False}),
    "woken, costed from a local path: read it again first (a host that joined may hold it)":
        ({**FILES, "woken": True, "placing": Placing(inputs=READ, estimate=EST)}, {"kind": "woken"},
         {"kind": "read_model"}, {"woken": False, "placing": Placing(estimate=EST)}),
    "read again after a wake: decide (the estimate stands)":
        ({**FILES, "placing": Placing(estimate=EST)}, {"kind": "read", "inputs": READ},
         {"kind": "decide", "then": "scheduled"}, {"placing": Placing(inputs=READ, estimate=EST)}),
    "stopped while PENDING: stop": ({**QUICK, **STOP, "placing": Placing(estimate=EST)}, {"kind": "woken"},
                                    {"kind": "teardown"}, {}),
    "not one its deployment wants: it ends, failed, naming why":
        ({**QUICK, **PLACING_NOW}, {"kind": "not_wanted", "why": "deployment m is not active"}, {"kind": "teardown"},
         {"placing": None, "unwanted": "deployment m is not active", "stop_requested": True}),
    "the place activity refused it: ERROR until stopped":
        ({**QUICK, **PLACING_NOW}, {"kind": "place_failed", "why": "invalid spec"},
         {"kind": "give_up", "reason": "cannot place the model: invalid spec"}, {"placing": None}),
    # --- placed by preemption ----------------------------------------------------------------------
    "it fits by taking others' GPUs: book it by preemption":
        ({**QUICK, **PLACING_NOW}, {"kind": "decided", "decision": D_PREEMPT, "estimate": EST}, {"kind": "preempt"},
         {"decision": D_PREEMPT, "placing": Placing(estimate=EST)}),
    "a victim or the capacity moved (stale): decide again":
        ({**QUICK, "decision": D_PREEMPT, "placing": Placing(estimate=EST)}, {"kind": "stale"},
         {"kind": "decide", "then": "starting", "local": True}, {}),
    "the preemption's booking failed: ERROR until stopped":
        ({**QUICK, "decision": D_PREEMPT, "placing": Placing(estimate=EST)}, {"kind": "book_failed", "why": "refused"},
         {"kind": "give_up", "reason": "cannot book the placement: refused"}, {"placing": None}),
    "booked by preemption: SCHEDULED naming the victims, each told (in the decision's order)":
        ({**QUICK, "decision": D_PREEMPT, "placing": Placing(estimate=EST)}, {"kind": "preempting", "plan": PLAN},
         {"kind": "tell_victims", "state": "scheduled", "reason": f"{WHY}; waiting for them to stop",
          "names": ["dev-1", "dev-0"], "row": D_PREEMPT.preempting_row("20.0 GiB VRAM")},
         {"plan": PLAN, "placing": Placing(estimate=EST, victims=["dev-0", "dev-1"], why=WHY)}),
    "booked by preemption while stopping: the victims are told all the same (their GPUs are its now)":
        ({**QUICK, **STOP, "decision": D_PREEMPT, "placing": Placing(estimate=EST)},
         {"kind": "preempting", "plan": PLAN},
         {"kind": "tell_victims", "state": "scheduled", "reason": f"{WHY}; waiting for them to stop",
          "names": ["dev-1", "dev-0"], "row": D_PREEMPT.preempting_row("20.0 GiB VRAM")},
         {"plan": PLAN, "placing": Placing(estimate=EST, victims=["dev-0", "dev-1"], why=WHY)}),
    "told: wait for both, at most 10 s": (PREEMPTING, {"kind": "told"},
                                          {"kind": "wait_victims", "names": ["dev-0", "dev-1"], "seconds": 10.0}, {}),
    "dev-0 said it stopped: wait for dev-1":
        ({**PREEMPTING, "victims_stopped": {"dev-0"}}, {"kind": "heard"},
         {"kind": "wait_victims", "names": ["dev-1"], "seconds": 10.0},
         {"placing": Placing(estimate=EST, victims=["dev-1"], why=WHY)}),
    "both said so: SCHEDULED, they stopped (then launched)":
        ({**PREEMPTING, "victims_stopped": {"dev-0", "dev-1"}}, {"kind": "heard"},
         {"kind": "record", "state": "scheduled", "reason": f"{WHY}; they stopped"}, {"placing": None}),
    "10 s without a word: ask the store": (PREEMPTING, {"kind": "quiet"},
                                           {"kind": "ask_victims", "names": ["dev-0", "dev-1"]}, {}),
    "the store shows only dev-0 running: wait for it":
        (PREEMPTING, {"kind": "asked", "names": ["dev-0"]},
         {"kind": "wait_victims", "names": ["dev-0"], "seconds": 10.0},
         {"placing": Placing(estimate=EST, victims=["dev-0"], why=WHY)}),
    "the store shows neither running: SCHEDULED, they stopped":
        (PREEMPTING, {"kind": "asked", "names": []},
         {"kind": "record", "state": "scheduled", "reason": f"{WHY}; they stopped"}, {"placing": None}),
    "stopped while waiting for the victims: stop (its booking is released)":
        ({**PREEMPTING, **STOP}, {"kind": "heard"}, {"kind": "teardown"}, {}),
    "no word and stopping: stop, nothing asked": ({**PREEMPTING, **STOP}, {"kind": "quiet"}, {"kind": "teardown"}, {}),
}


@pytest.mark.parametrize("before, event, action, changes", [*ROWS.values(), *PLACING.values()],
                         ids=[*ROWS.keys(), *PLACING.keys()])
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
    assert (got.kind, got.seconds, got.reason, after.restarts) == ("wait", 0.5, "oom; restart 1 on h1 in 0.5 s", 1)


def test_the_state_keeps_what_signals_wrote():
    # a transition copies the state: the flags and the news that signals wrote stay in the new one
    s = m.InstanceState(plan=PLAN, woken=True, victims_stopped={"b-0"},
                        news={"h2": HostNews(host="h2", kind="restarted")})
    after, _ = m.step(s, m.Event(kind="exited", now=T0, host="h1", why="x"), T)
    assert (after.woken, after.victims_stopped, set(after.news), after.plan) == (True, {"b-0"}, {"h2"}, PLAN)


def test_every_action_has_one_handler():
    # _do is a table (workflows/instance.py HANDLERS): every action the machine can name is in it, once
    from typing import get_args

    from workflows.instance import HANDLERS

    assert sorted(HANDLERS) == sorted(set(get_args(k.ActionKind)) - {k.TEARDOWN})
    assert all(callable(h) for h in HANDLERS.values())
