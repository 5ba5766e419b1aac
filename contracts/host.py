"""What crosses Temporal between the control plane and a host agent and both sides build: the task
queues' names, the workflows' timings, the host's report and the host workflow's input. Plain
pydantic models (no I/O); contracts/control.py re-exports them for the control plane. Fields are
added with defaults, never removed, so running histories stay decodable. Imports only
``scheduler`` and contracts/usage.py."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from contracts.host_auth import MAX_MS, HostAuth, Refusal
from contracts.decision import PlacementPlan
from contracts.usage import MAX_REPLICAS, ReplicaUse
from scheduler.bounds import Labels, Name
from scheduler.cluster import GPUList
from scheduler.command_set import MAX_CHARS as MAX_COMMAND_SET
from scheduler.groups.spec import MODE_CONNECTOR
from scheduler.limits import MAX_BYTES, MAX_GPUS, MAX_WAIT_S
from scheduler.naming import NAME_MAX, NAME_PATTERN

CONTROL_QUEUE = "gpuflow-control"


def host_queue(worker: str) -> str:
    return f"gpuflow-host-{worker}"


class Timings(BaseModel):
    """Every duration the workflows wait on. Defaults are for production; tests shorten them."""

    host_heartbeat_s: float = Field(10.0, gt=0, le=MAX_WAIT_S, description="An agent that misses heartbeats this long is lost. Default 10 s.")
    supervise_heartbeat_s: float = Field(300.0, gt=0, le=MAX_WAIT_S, description="A RUNNING replica's supervisor on its host heartbeats within this; the fallback when the host's own watch (host_heartbeat_s) does not report the host lost. Default 300 s.")
    host_schedule_to_start_s: float = Field(15.0, gt=0, le=MAX_WAIT_S, description="Work queued for a host nobody polls fails after this. Default 15 s.")
    unreachable_grace_s: float = Field(300.0, ge=0, le=MAX_WAIT_S, description="UNREACHABLE this long, then the reservation is released and the instance re-placed. Default 300 s.")
    restart_base_s: float = Field(10.0, ge=0, le=MAX_WAIT_S, description="Restart backoff: min(base * 2^(n-1), cap). Default 10 s.")
    restart_cap_s: float = Field(300.0, ge=0, le=MAX_WAIT_S, description="Restart backoff cap. Default 300 s.")
    ready_timeout_s: float = Field(600.0, gt=0, le=MAX_WAIT_S, description="A launched server must answer within this. Default 600 s.")
    settle_s: float = Field(3.0, ge=0, le=MAX_WAIT_S, description="A command without {port} is up once it has lived this long. Default 3 s.")
    liveness_s: float = Field(10.0, ge=0, le=MAX_WAIT_S, description="A RUNNING server's health is probed this often; 0 disables. Default 10 s.")
    liveness_failures: int = Field(3, ge=1, le=1000, description="Missed probes in a row before the server is stopped and restarted. Default 3.")
    pending_recheck_s: float = Field(600.0, gt=0, le=MAX_WAIT_S, description="Safety net: the PENDING queue is swept this often (the heads that fit, the first replica of each deployment). Default 600 s.")
    host_watch_s: float = Field(300.0, gt=0, le=MAX_WAIT_S, description="The host watch activity reports back at least this often. Default 300 s.")
    reconcile_s: float = Field(30.0, gt=0, le=MAX_WAIT_S, description="A deployment checks its instances' workflows this often. Default 30 s.")
    drain_timeout_s: float = Field(30.0, ge=0, le=MAX_WAIT_S, description="Before a replica is stopped (scale-down, delete, new spec), gateways stop routing to it and its requests in flight get this long to finish; 0 stops at once. Default 30 s.")
    orphan_check_s: float = Field(60.0, gt=0, le=MAX_WAIT_S, description="An agent stops processes whose instance is gone or placed on another host this often (and at start-up). Default 60 s.")
    download_attempts: int = Field(5, ge=1, le=1000, description="Tries of a hub download (each resumes the last) before the instance is ERROR and restarts later. Default 5.")

    @model_validator(mode="after")
    def _bounded(self) -> "Timings":
        """Every figure at most 30 days (counts at most 1000): one past what a timedelta holds
        would fail the workflow's task, forever."""
        for k, v in self:
            if v > (1000 if isinstance(v, int) else MAX_WAIT_S):
                raise ValueError(f"timings.{k} is {v!r}: more than {'1000' if isinstance(v, int) else '30 days'}")
        return self


# The KV connectors a prefill/decode group's modes hand KV over (scheduler/groups/spec.py MODE_CONNECTOR):
# the names an agent's operator may state (gpuflow agent --kv-connector, the inventory's kv_connectors)
KV_CONNECTORS = tuple(sorted({c for c in MODE_CONNECTOR.values() if c}))
MAX_KV_CONNECTORS = 16
# on the wire a name is only bounded: a newer agent's connector is one this control plane never asks for
KVConnector = Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[a-z0-9][a-z0-9._-]*$")]


def known_kv_connectors(names: list[str], where: str = "") -> list[str]:
    """``names`` sorted, each once; ValueError naming the first one gpuflow does not know (and ``where``
    it was given: a flag, a file), with the names it knows."""
    for n in names:
        if n not in KV_CONNECTORS:
            raise ValueError(f"{where + ': ' if where else ''}unknown KV connector {str(n)[:40]!r} "
                             f"(known: {', '.join(KV_CONNECTORS)})")
    return sorted(set(names))


class ForeignDegraded(BaseModel):
    """One card whose memory held by processes gpuflow did not start grew past the room this host's
    bookings leave on it (scheduler/foreign.py ``degradations``): figures only, worded by the reader."""

    index: int = Field(ge=0, le=MAX_GPUS)
    foreign: int = Field(ge=0, le=MAX_BYTES)
    booked: int = Field(ge=0, le=MAX_BYTES)
    room: int = Field(ge=0, le=MAX_BYTES)


class HostReport(BaseModel):
    """What an agent reports about its host. Validated where it is made (the agent refuses to start
    on an inventory that does not validate) and again where the control plane takes it in (the
    host workflow): a report that does not validate leaves its host NOT_READY with the reason, and
    the policy never sees it."""

    name: str = Field(min_length=1, max_length=NAME_MAX, pattern=NAME_PATTERN)
    cluster: str = Field("default", min_length=1, max_length=128)
    labels: Labels = {}
    ram_total: int = Field(ge=0, le=MAX_BYTES)
    unified_memory: bool = False
    reserved_ram: int = Field(0, ge=0, le=MAX_BYTES)
    reserved_vram: int = Field(0, ge=0, le=MAX_BYTES)
    backends: list[Annotated[str, Field(max_length=64)]] | None = Field(None, max_length=64)
    gpus: GPUList = []
    simulated: bool = False  # its GPUs come from an inventory file, not from NVML
    # what a launch starts here (HOST_KINDS): "processes" (engines run, whatever the GPUs), "nothing"
    # (gpuflow simulate: nothing is forked, a replica is simulated). None: an agent older than the field
    runs: Literal["processes", "nothing"] | None = None
    # the executables on the agent's PATH, for custom commands (scheduler/command_set.py), where it runs
    # processes and allows custom commands; None: not reported (the command filter keeps the host)
    commands: str | None = Field(None, max_length=MAX_COMMAND_SET)
    # the KV connectors its engines can run (worker_agent/kv_connectors.py), for prefill/decode groups'
    # members (scheduler/filters/pd_mode.py); None: not reported (an older agent, or not known: the filter keeps it)
    kv_connectors: list[KVConnector] | None = Field(None, max_length=MAX_KV_CONNECTORS)
    # the cards where other processes' memory grew past what this host's bookings leave free: an alert,
    # never an eviction (scheduler/foreign.py). None: none (the fingerprint then leaves it out, as before the field)
    foreign_degraded: list[ForeignDegraded] | None = Field(None, max_length=MAX_GPUS)
    agent_version: str = Field("", max_length=64)
    boot: str = Field("", max_length=64)  # one agent run's id: a hello with a new one is an agent restart
    # each replica's measured memory (contracts/usage.py), sampled every liveness_s; carried on the
    # watch's return, not part of the inventory (the fingerprint leaves it out). None: not sampled
    usage: list[ReplicaUse] | None = Field(None, max_length=MAX_REPLICAS)
    # who made it (contracts/host_auth.py): checked by the host workflow before the report counts;
    # not part of what its MAC covers, nor of the inventory (the fingerprint leaves it out)
    auth: HostAuth | None = None

    def fingerprint(self) -> str:
        import hashlib

        # a report without kv_connectors keeps the fingerprint it had before the field (recorded histories,
        # stored rows): an upgrade alone is no inventory change
        unset = ({"kv_connectors"} if self.kv_connectors is None else set()) | (
            {"foreign_degraded"} if self.foreign_degraded is None else set())
        return hashlib.sha256(self.model_dump_json(exclude={"agent_version", "boot", "usage", "auth", *unset}).encode()
                              ).hexdigest()[:16]


# The two kinds of host whose GPUs are not NVML's, and their words everywhere a host is shown
# (gpuflow hosts, the console, the Temporal UI): issue 36 found one word, "simulated", for both.
HOST_KINDS = {
    "real": "NVML's GPUs; engines run as processes",
    "mock-gpus": "GPUs from an inventory file; engines run as real processes (gpuflow dev --demo, tests)",
    "simulated": "gpuflow simulate's: GPUs from an inventory file, and nothing runs (replicas are simulated)",
}


def host_kind(simulated: bool, runs: str | None) -> str:
    """A host's kind (HOST_KINDS). A report from an agent older than ``runs`` with simulated GPUs
    could be either: it keeps the word it had, ``simulated``."""
    if runs == "nothing":
        return "simulated"
    if not simulated:
        return "real"
    return "mock-gpus" if runs == "processes" else "simulated"


CORDON_REASON_MAX = 200
CORDON_REASON_CHARS = " .,:;_()#@+=/'-"  # besides ASCII letters and digits
_CORDON_REASON = re.compile(r"[A-Za-z0-9" + re.escape(CORDON_REASON_CHARS) + r"]*")


def cordon_reason_problem(value: object) -> str | None:
    """Why ``value`` is not a cordon reason (None when it is): an operator's note, shown by the CLI,
    the console and the Temporal UI, so an allowlist of characters and a bound on its length."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if len(value) > CORDON_REASON_MAX:
        return f"is {len(value)} characters long (at most {CORDON_REASON_MAX})"
    bad = sorted({ch for ch in value if not _CORDON_REASON.fullmatch(ch)})
    if bad:
        return (f"may hold only ASCII letters, digits and {CORDON_REASON_CHARS.strip()!r} and spaces; "
                f"it holds {', '.join(repr(ch) for ch in bad[:5])}")
    return None


def _reason(value: str) -> str:
    problem = cordon_reason_problem(value)
    if problem:
        raise ValueError(f"the cordon reason {problem}")
    return value


CordonReason = Annotated[str, Field(max_length=CORDON_REASON_MAX), AfterValidator(_reason)]


class HostInput(BaseModel):
    name: str = Field(min_length=1, max_length=NAME_MAX, pattern=NAME_PATTERN)
    timings: Timings = Timings()
    report: HostReport | None = None
    state: Literal["ready", "not_ready"] = "not_ready"
    cordoned: bool = False  # carried across continue-as-new, as the operator left it
    cordon_reason: CordonReason = ""
    last_hello: int = Field(0, ge=0, le=MAX_MS)  # the stamp (ms) of the last hello accepted: an older one is a replay
    refusal: Refusal | None = None  # the last report refused (contracts/host_auth.py), still shown
    leaving: bool = False  # it leaves for good (HostWorkflow.leave): forgotten once it holds no reservation


# The booking check (no engine runs without its booking): before an agent starts a process it asks
# its own host workflow (``host/<worker>``, run by the control plane) with this update, whose handler
# reads the reservation ledger. The answer, not the launch request, says which processes (parts) the
# instance may run on this host, on which GPUs, and what its server's claim is there.
BOOKING_UPDATE = "booking"
# The orphan check's read, once per check: the bookings on this host of every instance the agent runs
# a process for (worker_agent/reconcile.py).
BOOKINGS_UPDATE = "bookings"
MAX_ASKED = 1024  # instances one bookings update asks about (an agent runs 64 by default)
PART_PATTERN = r"^[a-z0-9-]*$"  # "" (the server), rpc0, ray-head, ray0, node1 (contracts/booked_parts.py)
PART_MAX = 40  # LaunchRequest.part's bound
Part = Annotated[str, Field(max_length=PART_MAX, pattern=PART_PATTERN)]
Role = Literal["server", "rpc-server", "ray-head", "ray-worker", "sglang-node"]  # contracts/agent.py ROLES
_Index = Annotated[int, Field(ge=0, le=MAX_GPUS)]


class BookingQuery(BaseModel):
    """Which of this host's GPUs and parts the ledger booked for ``instance`` (a name: checked by the
    handler's validator, which refuses any other field)."""

    model_config = ConfigDict(extra="forbid")
    instance: str = Field(min_length=1, max_length=NAME_MAX, pattern=NAME_PATTERN)


class BookingsQuery(BaseModel):
    """The bookings on this host of each of ``instances`` (the orphan check's one read per check)."""

    model_config = ConfigDict(extra="forbid")
    instances: list[Name] = Field(max_length=MAX_ASKED)


class BookedPart(BaseModel):
    """One process a booking lets this host run: ``part`` "" is the inference server itself, the
    others the helpers of a placement across several workers (contracts/launch_parts.py), each in
    its ``role`` and on its GPUs (a subset of the ledger's lines here)."""

    part: Part = ""
    role: Role = "server"
    gpu_indexes: list[_Index] = Field([], max_length=MAX_GPUS)


class Booking(BaseModel):
    """The ledger's booking of one instance on one host: ``booked`` false when it holds none there,
    or when the instance is not one its deployment wants (``reason`` says which); a CPU-only
    booking holds a line without a GPU: booked, with no indexes. ``parts``: the processes it may
    run here, each at most once; ``vram_claim``/``ram_claim``: what the ledger booked here for its
    server (the main worker's lines), which the agent measures its use against."""

    booked: bool = False
    gpu_indexes: list[_Index] = Field([], max_length=MAX_GPUS)
    parts: list[BookedPart] = Field([], max_length=MAX_GPUS + 2)
    vram_claim: dict[_Index, Annotated[int, Field(ge=0, le=MAX_BYTES)]] = Field({}, max_length=MAX_GPUS)
    ram_claim: int = Field(0, ge=0, le=MAX_BYTES)
    reason: str = Field("", max_length=1000)

    def part(self, name: str) -> BookedPart | None:
        return next((p for p in self.parts if p.part == name), None)


class HostBookings(BaseModel):
    """The answer to BookingsQuery: instance -> its booking here (one not booked is left out)."""

    bookings: dict[Name, Booking] = Field({}, max_length=MAX_ASKED)


class BookingAsk(BaseModel):
    """The booking check's read (activities/booking.py), run by the host workflow for its agent."""

    instance: Name
    worker: Name


class BookingsAsk(BaseModel):
    """The orphan check's read (activities/booking.py), run by the host workflow for its agent."""

    instances: list[Name] = Field(max_length=MAX_ASKED)
    worker: Name


class HeldAsk(BaseModel):
    """Whether the ledger holds exactly ``plan`` for ``instance``, a wanted replica (the instance
    workflow asks before it trusts a placement carried across continue-as-new)."""

    instance: Name
    plan: PlacementPlan
