"""Placing one replica, as rows of the instance's pure machine (workflows/instance_machine.py
``step``): each call of a placement is an action, each result an event.

1. ANALYZING is recorded first, unless the spec states its resources (``quick``: nothing to read).
2. A spec costed from a local path has it read on the hosts that could run it (READ_MODEL). No host
   has it: PENDING with each host's answer until a wake or ``pending_recheck_s``; the file is no
   model: ERROR until a new spec.
3. A spec costed from files is estimated (ESTIMATE). A hub that does not answer: ERROR, and again
   after min(base * 2^(n-1), cap) s (the restart backoff); a wrong model: ERROR until a new spec.
4. DECIDE: one call decides and books. ``decided`` is booked (the booking wrote the row: BOOKED,
   then launched), pending (PENDING with the decisive reasons until woken: a release, a host, the
   queue's sweep; a local path is read again first, a host that joined may hold it), or placed
   by preemption (PREEMPT); one the queue held back decides again after HELD_RECHECK_S if no wake
   came first. A replica its deployment does not want ends (NotWanted); any other
   refusal is the spec's: ERROR until stopped.
5. Preemption: the ledger moves the victims' GPUs (a stale decision is decided again), each victim
   is told (always: their GPUs are the preemptor's now), and it waits until each said it stopped,
   asking the store every VICTIM_POLL_S, before it launches.

A stop is heeded before every call (the top of the life's loop); a placement under way is not
interrupted by a preemption notice or a continue-as-new, which wait until it ends."""

from __future__ import annotations

from contracts.control import DecisionRecord, Timings
from scheduler.estimate import needs_files, states_resources
from scheduler.reasons import pending_text
from scheduler.spec import ModelSpec
from workflows.instance_state import (ASK_VICTIMS, BOOKED, DECIDE, ESTIMATE, GIVE_UP, PREEMPT, READ_MODEL, RECORD,
                                      TELL_VICTIMS, WAIT, WAIT_VICTIMS, Action, Event, InstanceState, Placing, backoff)

VICTIM_POLL_S = 10.0  # the preemptor asks the store this often whether its victims stopped (signals come first)
# A replica the PENDING queue held back (DecisionRecord.held: a replica ahead of it was woken for the
# capacity freed then) decides again this soon, woken or not: by then the one ahead has booked that
# capacity (and the policy's own reason replaces the hold's) or has not (and it may be placed). Without
# it, a hold said "while X takes the capacity freed now" long after X had, and a replica held for one
# that never took it waited for the queue's sweep (pending_recheck_s).
HELD_RECHECK_S = 10.0
EVENTS = frozenset({"read", "path_missing", "model_bad", "estimated", "estimate_failed", "decided", "not_wanted",
                    "place_failed", "preempting", "stale", "book_failed", "told", "heard", "quiet", "asked", "woken"})


def hub_source(spec: ModelSpec) -> bool:
    """Its files come from a hub: the launch waits for a download (recorded DOWNLOADING) first."""
    return bool(spec.source.huggingface or spec.source.modelscope)


def facts(spec: ModelSpec) -> dict[str, bool]:
    """What the spec says of placing it (InstanceState's quick, reads_files, hub)."""
    return {"quick": states_resources(spec), "reads_files": needs_files(spec), "hub": hub_source(spec)}


def pending_reason(d: DecisionRecord, preempted_why: str) -> str:
    """What a replica that does not fit shows while it waits: a quota (or the queue's hold:
    DecisionRecord.held) leads, as it is; otherwise the decisive reasons as the PENDING queue says
    them (scheduler/reasons.py), after the preemptor's name when it was preempted."""
    if d.quota or d.held:
        shown = min(3, d.decisive or 3)  # the decisive reasons lead
        parts = ["; ".join(d.reasons[:shown]) or "no candidate", preempted_why]
    else:
        parts = [preempted_why, pending_text(d.reasons, d.decisive)]
    return "; ".join(x for x in parts if x)


def begin(s: InstanceState) -> tuple[InstanceState, Action]:
    """A placement starts afresh (nothing read, nothing estimated)."""
    s = s.model_copy(update={"placing": Placing()})
    return (s, Action(kind=RECORD, state="analyzing")) if not s.quick else call(s)


def call(s: InstanceState) -> tuple[InstanceState, Action]:
    """The next call of the placement under way. A call that a wake should follow clears ``woken``
    first (a wake that comes during it then counts)."""
    p = s.placing
    if p.why:
        return _victims(s)
    if s.reads_files and p.inputs is None:
        return s.model_copy(update={"woken": False}), Action(kind=READ_MODEL)
    if not s.quick and p.estimate is None:
        return s, Action(kind=ESTIMATE)
    then = "starting" if s.quick and not s.hub else "scheduled"  # launched in the task that books it: STARTING
    return s.model_copy(update={"woken": False}), Action(kind=DECIDE, then=then, local=s.quick)


def step(s: InstanceState, ev: Event, t: Timings) -> tuple[InstanceState, Action | None]:
    """A placing call's result: the state with it, and the action it calls for; None: carry on at
    the top of the loop (where a stop comes first)."""
    k, p = ev.kind, s.placing
    if k == "read":
        return _with(s, inputs=ev.inputs), None
    if k == "estimated":
        return _with(s, estimate=ev.estimate, tries=0), None
    if k == "woken":  # the wait ended: a local path is read again (a host that joined may hold it)
        return (_with(s, inputs=None) if s.reads_files else s), None
    if k == "asked":
        return _with(s, victims=sorted(ev.names)), None
    if k == "quiet":  # no victim said so within VICTIM_POLL_S: ask the store
        return s, (None if s.stop_requested else Action(kind=ASK_VICTIMS, names=p.victims))
    if k == "path_missing":
        return s, Action(kind=WAIT, state="pending", reason=ev.why, seconds=t.pending_recheck_s, until="woken")
    if k == "estimate_failed" and ev.retry:
        n = p.tries + 1
        delay = backoff(n, t.restart_base_s, t.restart_cap_s)
        return _with(s, tries=n), Action(kind=WAIT, state="error", seconds=delay, until="stop",
                                         reason=f"cannot estimate the model: {ev.why}; trying again in {delay:g} s")
    if k in GIVE_UP_WITH:
        return s.model_copy(update={"placing": None}), Action(kind=GIVE_UP, reason=f"{GIVE_UP_WITH[k]}: {ev.why}")
    if k == "not_wanted":  # not one its deployment wants (started by hand, or going): it ends, failed
        return s.model_copy(update={"placing": None, "unwanted": ev.why, "stop_requested": True}), None
    if k == "decided":
        return _decided(s, ev)
    if k == "preempting":
        return _preempting(s, ev)
    return s, None  # stale (decide again), told, heard


GIVE_UP_WITH = {"model_bad": "cannot estimate the model", "estimate_failed": "cannot estimate the model",
                "place_failed": "cannot place the model", "book_failed": "cannot book the placement"}


def _with(s: InstanceState, **placing) -> InstanceState:
    return s.model_copy(update={"placing": s.placing.model_copy(update=placing)})


def _decided(s: InstanceState, ev: Event) -> tuple[InstanceState, Action]:
    d = ev.decision
    est = s.placing.estimate or ev.estimate
    s = _with(s, estimate=est).model_copy(update={"decision": d})
    if ev.plan is not None:  # booked: the booking wrote the row (STARTING with the launch in this task)
        s = s.model_copy(update={"plan": ev.plan, "preempted_why": "", "placing": None, "booking_proof": ev.proof})
        if s.quick and not s.hub:
            return s, Action(kind=BOOKED, state="starting")
        return s, Action(kind=BOOKED, state="scheduled", reason=f"{d.strategy}: score {d.score}")
    if d.scheduled and d.plan is not None and d.victims:  # placed by taking the GPUs of others
        return s, Action(kind=PREEMPT)
    return s, Action(kind=WAIT, state="pending", reason=pending_reason(d, s.preempted_why),
                     row=d.pending_row(est.summary if est else ""), until="woken",
                     seconds=HELD_RECHECK_S if d.held else 0.0)


def _preempting(s: InstanceState, ev: Event) -> tuple[InstanceState, Action]:
    """The ledger moved the victims' GPUs to it: tell each victim, even when stopping."""
    d, p = s.decision, s.placing
    names = [v.name for v in d.victims]
    why = f"preempting {', '.join(names)} {d.preempt_why}".rstrip()
    s = s.model_copy(update={"plan": ev.plan, "preempted_why": "",
                             "placing": p.model_copy(update={"victims": sorted(names), "why": why})})
    return s, Action(kind=TELL_VICTIMS, state="scheduled", reason=f"{why}; waiting for them to stop", names=names,
                     row=d.preempting_row(p.estimate.summary if p.estimate else ""))


def _victims(s: InstanceState) -> tuple[InstanceState, Action]:
    """Wait for the victims that did not say they stopped; once none is left, it is placed."""
    p = s.placing
    left = [v for v in p.victims if v not in s.victims_stopped]
    if not left:
        return s.model_copy(update={"placing": None}), Action(kind=RECORD, state="scheduled",
                                                              reason=f"{p.why}; they stopped")
    return _with(s, victims=left), Action(kind=WAIT_VICTIMS, names=left, seconds=VICTIM_POLL_S)
