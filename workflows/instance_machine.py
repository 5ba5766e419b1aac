"""The instance workflow's decisions, pure: ``step(state, event, timings) -> (state, action)``.

``InstanceState`` is everything one replica's workflow holds (its signals set the flags in it;
the query reads it). An ``Event`` is what the last action came to (``next``: it is done, decide
afresh; ``started``; ``placed``; a placing call's result; or how a run on the host ended:
stopped, exited, failed, invalid, unbooked, unreachable). The ``Action`` says what the workflow
does now, one call each; the workflow class (workflows/instance.py) does it with one small handler
per kind (activities, timers, records, signals) and feeds back the next event, as the rollout's
``next_step`` (scheduler/rollout.py) drives a rollout. No I/O and no clock here: the time arrives
in the event (``workflow.now()``), so every decision can be tested as a table
(tests/test_instance_machine.py). The types are in workflows/instance_state.py, placing's rows in
workflows/place_machine.py.

The life: PENDING -> place (estimate, decide, book: place_machine.py) -> launch -> RUNNING ->
supervised until the run ends. A process that
exits (or cannot start) is restarted on the same host after min(base * 2^(n-1), cap) seconds; one
that ran out of GPU memory (its reason names it) is released and placed again, at once the first
time (the larger claim its OOM earned is booked where a GPU can hold it), after the backoff later.
A host that stops answering makes it UNREACHABLE; launches are tried again a second apart with
what is left of the grace (a frozen agent's poll can take a launch and never answer it), and once
the grace is over the reservation is released and it is placed elsewhere.
"""

from __future__ import annotations

from datetime import datetime

from contracts.control import Timings
from scheduler.claim_apply import is_oom
from workflows import place_machine as place
from workflows.instance_state import (ABANDON_HOST, CHECK_HELD, CONTINUE_AS_NEW, DISOWN, GIVE_UP, GIVE_WAY, LAUNCH,
                                      LET_GO, RECORD, RETRY, TEARDOWN, WAIT, Action, Event, InstanceState, backoff)

__all__ = ["Action", "Event", "InstanceState", "backoff", "grace_left", "step"]


def grace_left(s: InstanceState, now: datetime, t: Timings) -> float:
    """Seconds of the unreachable grace left (the outage began at ``s.unreachable_since``)."""
    return t.unreachable_grace_s - (now - s.unreachable_since).total_seconds()


def step(s: InstanceState, ev: Event, t: Timings) -> tuple[InstanceState, Action]:
    """What the replica does after ``ev``, and its state then."""
    if ev.kind in place.EVENTS:  # a placing call's result (workflows/place_machine.py)
        s, action = place.step(s, ev, t)
        return (s, action) if action is not None else _next(s, ev, t)
    if ev.kind == "started":  # a placement carried across continue-as-new is checked with the ledger first
        return (s, Action(kind=CHECK_HELD)) if s.plan is not None else _next(s, ev, t)
    if ev.kind == "held":  # the ledger's word on it: "" when it holds exactly it
        if not ev.why:
            return _next(s, ev, t)
        return s, Action(kind=DISOWN, reason=f"the placement its input carried is not the ledger's ({ev.why}); "
                                             "placing it again")
    if ev.kind == "next":
        return _next(s, ev, t)
    if ev.kind == "placed":  # launched at once; a stop, or a preemption that arrived while placing, first
        return _next(s, ev, t) if s.stop_requested or s.preempted is not None else (s, _launch(s, ev, t))
    if ev.kind == "stopped":  # for a preemptor (give way, then wait PENDING) or for good
        return _next(s, ev, t) if not s.stop_requested and s.preempted is not None else (s, Action(kind=TEARDOWN))
    if ev.kind == "invalid":  # the spec's fault: no restart, no re-placement
        return s, Action(kind=GIVE_UP, reason=f"refused by {ev.host}: {ev.why}")
    if ev.kind == "unbooked":  # the ledger no longer holds its placement (taken by a preemptor, say)
        return (s.model_copy(update={"unreachable_since": None}),
                Action(kind=LET_GO, reason=f"{ev.host} found no booking for it ({ev.why}); placing it again"))
    return _ended(s, ev, t)


def _ended(s: InstanceState, ev: Event, t: Timings) -> tuple[InstanceState, Action]:
    """A run on the host ended: unreachable (the grace), or exited or failed (a restart after the backoff)."""
    if ev.reached:  # the host answered (launched or adopted): an outage after this is a new episode
        s = s.model_copy(update={"unreachable_since": None})
    if ev.kind == "unreachable":
        if s.unreachable_since is None:
            return (s.model_copy(update={"unreachable_since": ev.now}),
                    Action(kind=RECORD, state="unreachable", reason=f"host {ev.host} stopped answering: {ev.why}"))
        left = grace_left(s, ev.now, t)
        if left > 0:  # failed again within the grace: the placement is kept; try again a second apart
            return s, Action(kind=RETRY, seconds=min(1.0, left))
        return s.model_copy(update={"unreachable_since": None}), Action(kind=ABANDON_HOST, host=ev.host)
    n = s.restarts + 1
    if ev.kind == "exited" and is_oom(ev.why):  # its claim may have grown since (learned claims: issue 42)
        # the first restart at once (an applied claim was bumped: it may fit now); a later one after the
        # backoff, as any restart: a claim that is only advised books the same again, and it would OOM again
        delay = 0.0 if n == 1 else backoff(n - 1, t.restart_base_s, t.restart_cap_s)
        return (s.model_copy(update={"unreachable_since": None, "restarts": n, "pid": None}),
                Action(kind=LET_GO, seconds=delay, reason=f"{ev.why}; out of GPU memory: its booking released, "
                       f"placing it again" + (f" in {delay:g} s (restart {n})" if delay else "")))
    # exited, or failed to start: ERROR, then a restart on the same host after the backoff (or a stop or preemption)
    delay = backoff(n, t.restart_base_s, t.restart_cap_s)
    return (s.model_copy(update={"unreachable_since": None, "restarts": n, "pid": None}),
            Action(kind=WAIT, state="error", reason=f"{ev.why}; restart {n} on {s.worker} in {delay:g} s",
                   seconds=delay, until="preempted"))


def _next(s: InstanceState, ev: Event, t: Timings) -> tuple[InstanceState, Action]:
    """The top of the life's loop, in this order: stopping; the placement under way, which nothing
    else interrupts; giving way (before continue-as-new: it holds nothing after); continue-as-new;
    placing; launching."""
    if s.stop_requested:
        return s, Action(kind=TEARDOWN)
    if s.placing is not None:
        return place.call(s)
    if s.preempted is not None:
        return s, Action(kind=GIVE_WAY)
    if ev.split:
        return s, Action(kind=CONTINUE_AS_NEW)
    if s.plan is None:
        return place.begin(s)
    return s, _launch(s, ev, t)


def _launch(s: InstanceState, ev: Event, t: Timings) -> Action:
    """A launch with the host's full patience; within an outage, with what is left of the grace
    (at least a second), and quietly (the record says UNREACHABLE meanwhile)."""
    if s.unreachable_since is None:
        return Action(kind=LAUNCH, seconds=t.host_schedule_to_start_s)
    return Action(kind=LAUNCH, seconds=max(1.0, grace_left(s, ev.now, t)), quiet=True)
