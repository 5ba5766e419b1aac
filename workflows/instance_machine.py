"""The instance workflow's decisions, pure: ``step(state, event, timings) -> (state, action)``.

``InstanceState`` is everything one replica's workflow holds (its signals set the flags in it;
the query reads it). An ``Event`` is what the last action came to (``next``: it is done, decide
afresh; ``placed``; or how a run on the host ended: stopped, exited, failed, invalid, unbooked,
unreachable). The ``Action`` says what the workflow does now; the workflow class
(workflows/instance.py) does it (activities, timers, records) and feeds back the next event, as
the rollout's ``next_step`` (scheduler/rollout.py) drives a rollout. No I/O and no clock here:
the time arrives in the event (``workflow.now()``), so every decision can be tested as a table
(tests/test_instance_machine.py).

The life: PENDING -> place -> launch -> RUNNING -> supervised until the run ends. A process that
exits (or cannot start) is restarted on the same host after min(base * 2^(n-1), cap) seconds.
A host that stops answering makes it UNREACHABLE; launches are tried again a second apart with
what is left of the grace (a frozen agent's poll can take a launch and never answer it), and once
the grace is over the reservation is released and it is placed elsewhere.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel

from contracts.control import DecisionRecord, HostNews, PlacementPlan, PreemptNotice, Timings

# --- actions ---------------------------------------------------------------------------------------
TEARDOWN = "teardown"  # the life is over (stopped, or given up and then stopped): stop, release, DELETED
GIVE_WAY = "give_way"  # preempted: release, PENDING naming the preemptor, tell it
CONTINUE_AS_NEW = "continue_as_new"  # the history grew long: a new run with the placement
PLACE = "place"  # estimate, decide, book (place_steps.py)
LAUNCH = "launch"  # launch (or adopt) on the host and supervise (host_steps.py); ``seconds``: patience
RECORD = "record"  # write ``state``/``reason`` to the store, then decide again
RETRY = "retry"  # sleep ``seconds``, then launch again (still within the grace)
ABANDON_HOST = "abandon_host"  # the grace is over: release, PENDING, placed elsewhere
LET_GO = "let_go"  # the ledger no longer holds its placement: release, PENDING with ``reason``
GIVE_UP = "give_up"  # the spec's fault: ERROR with ``reason`` until stopped
WAIT_RESTART = "wait_restart"  # ERROR with ``reason``, then ``seconds`` of backoff (or a stop/preemption)

ActionKind = Literal["teardown", "give_way", "continue_as_new", "place", "launch", "record", "retry",
                     "abandon_host", "let_go", "give_up", "wait_restart"]
EventKind = Literal["next", "placed", "stopped", "exited", "failed", "invalid", "unbooked", "unreachable"]


class InstanceState(BaseModel):
    """One replica's workflow state, whole. Signals set ``stop_requested``, ``woken``,
    ``preempted``, ``victims_stopped`` and ``news``; the rest changes by what the workflow did."""

    state: str = "pending"
    reason: str = ""
    plan: PlacementPlan | None = None
    restarts: int = 0
    pid: int | None = None
    port: int | None = None
    kv_events_port: int | None = None  # its engine's KV-cache events (LaunchResult), recorded for the gateways
    key_id: str | None = None  # its engine key's nonce (LaunchResult): the store makes the key from it (not a secret)
    launch_mac: str = ""  # its host's MAC over the launch (LaunchResult.mac): the store checks it before RUNNING
    address: str | None = None  # where the server listens (the host agent's advertised address)
    decision: DecisionRecord | None = None  # carried across continue-as-new, for explain
    stop_requested: bool = False
    woken: bool = False  # capacity_changed: a PENDING replica decides again
    preempted: PreemptNotice | None = None  # a preemption took its GPUs: stop, then wait PENDING
    preempted_why: str = ""  # shown first while it waits, until it is placed again
    victims_stopped: set[str] = set()  # as a preemptor: the victims that said they stopped
    news: dict[str, HostNews] = {}  # host -> what its watch last said (host_news)
    unreachable_since: datetime | None = None  # when this outage began (None: the host answers)
    parts: dict[str, str] = {}  # helper process key (instance@part) -> its worker
    processes_stopped: bool = False  # its processes were stopped on every host since the last launch
    recorded: tuple | None = None  # the last row written (a record equal to it is skipped)
    source_key: str | None = None

    @property
    def worker(self) -> str | None:
        return self.plan.worker if self.plan else None


class Event(BaseModel):
    kind: EventKind
    now: datetime  # workflow.now() when it happened
    why: str = ""
    host: str = ""
    reached: bool = False  # a run on the host: the host answered (launched or adopted) before it ended
    split: bool = False  # Temporal suggests continue-as-new


class Action(BaseModel):
    kind: ActionKind
    state: str = ""  # RECORD, WAIT_RESTART: the state written
    reason: str = ""
    host: str = ""  # ABANDON_HOST: the host lost
    seconds: float = 0.0  # LAUNCH: schedule-to-start patience; RETRY: the pause; WAIT_RESTART: the backoff
    quiet: bool = False  # LAUNCH: a retry within the grace records no STARTING or DOWNLOADING


def backoff(n: int, base: float, cap: float) -> float:
    """Seconds before try n (1-based): min(base * 2^(n-1), cap), for any n: the exponent stops at 64
    (the cap, at most 30 days, has long won by then; 2 ** 1029 once overflowed the float, and
    the workflow task failed forever)."""
    return min(base * 2 ** min(max(n - 1, 0), 64), cap)


def grace_left(s: InstanceState, now: datetime, t: Timings) -> float:
    """Seconds of the unreachable grace left (the outage began at ``s.unreachable_since``)."""
    return t.unreachable_grace_s - (now - s.unreachable_since).total_seconds()


def step(s: InstanceState, ev: Event, t: Timings) -> tuple[InstanceState, Action]:
    """What the replica does after ``ev``, and its state then."""
    if ev.kind == "next":
        return _next(s, ev, t)
    if ev.kind == "placed":  # a preemption that arrived while it was placing is heeded first
        return _next(s, ev, t) if s.preempted is not None else (s, _launch(s, ev, t))
    if ev.kind == "stopped":  # for a preemptor (give way, then wait PENDING) or for good
        return _next(s, ev, t) if not s.stop_requested and s.preempted is not None else (s, Action(kind=TEARDOWN))
    if ev.kind == "invalid":  # the spec's fault: no restart, no re-placement
        return s, Action(kind=GIVE_UP, reason=f"refused by {ev.host}: {ev.why}")
    if ev.kind == "unbooked":  # the ledger no longer holds its placement (taken by a preemptor, say)
        return (s.model_copy(update={"unreachable_since": None}),
                Action(kind=LET_GO, reason=f"{ev.host} found no booking for it ({ev.why}); placing it again"))
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
    # exited, or failed to start: ERROR, then a restart on the same host after the backoff
    n = s.restarts + 1
    delay = backoff(n, t.restart_base_s, t.restart_cap_s)
    return (s.model_copy(update={"unreachable_since": None, "restarts": n, "pid": None}),
            Action(kind=WAIT_RESTART, state="error", reason=f"{ev.why}; restart {n} on {s.worker} in {delay:g} s",
                   seconds=delay))


def _next(s: InstanceState, ev: Event, t: Timings) -> tuple[InstanceState, Action]:
    """The top of the life's loop, in this order: stopping, giving way (before continue-as-new:
    it holds nothing after), continue-as-new, placing, launching."""
    if s.stop_requested:
        return s, Action(kind=TEARDOWN)
    if s.preempted is not None:
        return s, Action(kind=GIVE_WAY)
    if ev.split:
        return s, Action(kind=CONTINUE_AS_NEW)
    if s.plan is None:
        return s, Action(kind=PLACE)
    return s, _launch(s, ev, t)


def _launch(s: InstanceState, ev: Event, t: Timings) -> Action:
    """A launch with the host's full patience; within an outage, with what is left of the grace
    (at least a second), and quietly (the record says UNREACHABLE meanwhile)."""
    if s.unreachable_since is None:
        return Action(kind=LAUNCH, seconds=t.host_schedule_to_start_s)
    return Action(kind=LAUNCH, seconds=max(1.0, grace_left(s, ev.now, t)), quiet=True)
