"""What the instance workflow's pure machine reads and says (workflows/instance_machine.py ``step``):
the replica's state (``InstanceState``, with a placement under way: ``Placing``), what the last
action came to (``Event``) and what to do now (``Action``). Plain models, no I/O: the workflow
(workflows/instance.py) holds one state, its signals write flags in it, and it does each action
with one small handler."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel

from contracts.booking_proof import BookingProof
from contracts.control import DecisionRecord, EstimateRecord, HostNews, PlacementPlan, PreemptNotice
from contracts.estimate_inputs import EstimateInputs

# --- actions: what the workflow does now, each one call (an activity, a record, a wait, some signals) ---
TEARDOWN = "teardown"  # the life is over (stopped, or given up and then stopped): stop, release, DELETED
GIVE_WAY = "give_way"  # preempted: release, PENDING naming the preemptor, tell it
CONTINUE_AS_NEW = "continue_as_new"  # the history grew long: a new run with the placement
CHECK_HELD = "check_held"  # a placement carried across continue-as-new: does the ledger hold exactly it?
DISOWN = "disown"  # it does not: stop what the placement names everywhere, release, PENDING with ``reason``
READ_MODEL = "read_model"  # the hosts that could run it read the spec's local path (model_read.py)
ESTIMATE = "estimate"  # the model's request, from its files (cancelled by a stop)
DECIDE = "decide"  # decide and book (place_replica): ``then`` the state the booking writes; ``local``: a local activity
BOOKED = "booked"  # the booking wrote the row ``state``/``reason``: this workflow follows it
PREEMPT = "preempt"  # book the decision by moving its victims' GPUs (preempt_placement)
TELL_VICTIMS = "tell_victims"  # record ``state``/``reason``/``row``, then signal each of ``names`` preempt
WAIT_VICTIMS = "wait_victims"  # until each of ``names`` said it stopped, or a stop; at most ``seconds``
ASK_VICTIMS = "ask_victims"  # which of ``names`` the store still shows running (victims_left)
LAUNCH = "launch"  # launch (or adopt) on the host and supervise (host_steps.py); ``seconds``: patience
RECORD = "record"  # write ``state``/``reason`` to the store, then decide again
WAIT = "wait"  # record ``state``/``reason`` (and ``row``), then wait ``until`` (at most ``seconds``; 0: no limit)
RETRY = "retry"  # sleep ``seconds``, then launch again (still within the grace)
ABANDON_HOST = "abandon_host"  # the grace is over: release, PENDING, placed elsewhere
LET_GO = "let_go"  # the ledger no longer holds its placement: release, PENDING with ``reason``
GIVE_UP = "give_up"  # the spec's fault: ERROR with ``reason`` until stopped

NEWS_MAX = 64  # hosts whose news, and processes whose ends, an instance holds (host_news is anyone's to send)

ActionKind = Literal["teardown", "give_way", "continue_as_new", "check_held", "disown", "read_model", "estimate",
                     "decide", "booked", "preempt", "tell_victims", "wait_victims", "ask_victims", "launch", "record",
                     "wait", "retry", "abandon_host", "let_go", "give_up"]
# started: the run begins. next: the action is done. placed: a placement is held. How a run on the
# host ended: stopped, exited, failed, invalid, unbooked, unreachable. Placing's results: held (the
# ledger's word on a carried placement), read, path_missing, model_bad, estimated, estimate_failed,
# decided, not_wanted, place_failed, preempting, stale, book_failed, told, heard, quiet, asked, woken.
EventKind = Literal["started", "next", "placed", "stopped", "exited", "failed", "invalid", "unbooked", "unreachable",
                    "held", "read", "path_missing", "model_bad", "estimated", "estimate_failed", "decided",
                    "not_wanted", "place_failed", "preempting", "stale", "book_failed", "told", "heard", "quiet",
                    "asked", "woken"]
Until = Literal["stop", "woken", "preempted"]  # WAIT ends early on: a stop; a wake or a stop; a stop or a preemption


def backoff(n: int, base: float, cap: float) -> float:
    """Seconds before try n (1-based): min(base * 2^(n-1), cap), for any n: the exponent stops at 64
    (the cap, at most 30 days, has long won by then; 2 ** 1029 once overflowed the float, and
    the workflow task failed forever). A restart's, and an estimate's the hub did not answer."""
    return min(base * 2 ** min(max(n - 1, 0), 64), cap)


class Placing(BaseModel):
    """A placement under way: what its calls found so far. None in the state when none is."""

    inputs: EstimateInputs | None = None  # a host's read of the spec's local path (read again after a wake)
    estimate: EstimateRecord | None = None  # the model's request (the place activity's, for a spec that states it)
    tries: int = 0  # estimates the hub did not answer, in a row
    victims: list[str] = []  # as a preemptor: the victims still to stop, sorted
    why: str = ""  # as a preemptor: "preempting a, b to reclaim ..." (set once its booking moved their GPUs)


class InstanceState(BaseModel):
    """One replica's workflow state, whole. Signals set ``stop_requested``, ``woken``,
    ``preempted``, ``victims_stopped``, ``news`` and ``exits``; the rest changes by what the workflow did."""

    state: str = "pending"
    reason: str = ""
    plan: PlacementPlan | None = None
    restarts: int = 0
    pid: int | None = None
    port: int | None = None
    kv_events_port: int | None = None  # its engine's KV-cache events (LaunchResult), recorded for the gateways
    bootstrap_port: int | None = None  # its engine's KV hand-off port (LaunchResult), recorded for the gateways
    key_id: str | None = None  # its engine key's nonce (LaunchResult): the store makes the key from it (not a secret)
    launch_mac: str = ""  # its host's MAC over the launch (LaunchResult.mac): the store checks it before RUNNING
    address: str | None = None  # where the server listens (the host agent's advertised address)
    decision: DecisionRecord | None = None  # carried across continue-as-new, for explain
    booking_proof: BookingProof | None = None  # its booking signed for its host: handed to the next launch, once
    stop_requested: bool = False
    woken: bool = False  # capacity_changed: a PENDING replica decides again
    preempted: PreemptNotice | None = None  # a preemption took its GPUs: stop, then wait PENDING
    preempted_why: str = ""  # shown first while it waits, until it is placed again
    victims_stopped: set[str] = set()  # as preemptor: the victims that said they stopped
    news: dict[str, HostNews] = {}  # host -> what its watch last said (host_news): lost, restarted; at most NEWS_MAX
    exits: dict[str, HostNews] = {}  # process key -> its host's word that it ended (host_news: exited); NEWS_MAX
    pids: dict[str, int] = {}  # process key -> the pid its last launch (or adoption) answered
    unreachable_since: datetime | None = None  # when this outage began (None: the host answers)
    parts: dict[str, str] = {}  # helper process key (instance@part) -> its worker
    processes_stopped: bool = False  # its processes were stopped on every host since the last launch
    recorded: tuple | None = None  # the last row written (a record equal to it is skipped)
    source_key: str | None = None
    placing: Placing | None = None  # a placement under way
    unwanted: str = ""  # why the ledger refused to place it (NotWanted): it ends, failed, naming that
    # what the spec says of placing it (workflows/place_machine.py facts), set as the run starts
    quick: bool = False  # it states its resources: costed by the place activity, no estimate, no ANALYZING
    reads_files: bool = False  # its local path is read on the hosts first (the estimate reads it)
    hub: bool = False  # its files come from a hub: the launch downloads them first

    @property
    def worker(self) -> str | None:
        return self.plan.worker if self.plan else None

    def drop_old_exits(self) -> None:
        """Forget the ends of processes it no longer runs: their pid is not the one its last launch of
        that key answered (an earlier process's, or one it never launched)."""
        self.exits = {k: n for k, n in self.exits.items() if n.pid == self.pids.get(k)}


class Event(BaseModel):
    kind: EventKind
    now: datetime  # workflow.now() when it happened
    why: str = ""
    host: str = ""
    reached: bool = False  # a run on the host: the host answered (launched or adopted) before it ended
    split: bool = False  # Temporal suggests continue-as-new
    retry: bool = False  # estimate_failed: the hub did not answer (worth trying again)
    inputs: EstimateInputs | None = None  # read
    estimate: EstimateRecord | None = None  # estimated; decided (the place activity's, when it costed the spec)
    decision: DecisionRecord | None = None  # decided
    plan: PlacementPlan | None = None  # decided (booked), preempting
    proof: BookingProof | None = None  # decided (booked on one host): the booking signed for it
    names: list[str] = []  # asked: the victims the store still shows running


class Action(BaseModel):
    kind: ActionKind
    state: str = ""  # RECORD, WAIT, BOOKED, TELL_VICTIMS: the state written (or followed)
    reason: str = ""
    host: str = ""  # ABANDON_HOST: the host lost
    seconds: float = 0.0  # LAUNCH: schedule-to-start patience; RETRY: the pause; WAIT, WAIT_VICTIMS: the limit
    quiet: bool = False  # LAUNCH: a retry within the grace records no STARTING or DOWNLOADING
    until: Until = "stop"  # WAIT: what ends it early
    row: dict[str, Any] | None = None  # WAIT, TELL_VICTIMS: the decision's summary for the store's row
    then: str = ""  # DECIDE: the state a booking writes (starting, or scheduled)
    local: bool = False  # DECIDE: as a local activity (nothing to read: a decision and one transaction)
    names: list[str] = []  # TELL_VICTIMS, WAIT_VICTIMS, ASK_VICTIMS: the victims
