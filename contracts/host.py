"""What crosses Temporal between the control plane and a host agent and both sides build: the host's
report and the host workflow's input, the booking check; re-exported here, the task queues' names
and the workflows' timings (contracts/timings.py), the hosts' kinds (host_kinds.py) and the KV
connectors (kv_connectors.py). Plain pydantic models (no I/O); contracts/control.py re-exports them
for the control plane. Fields are added with defaults, never removed, so running histories stay
decodable. Imports only ``scheduler`` and other contracts."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from contracts.host_auth import MAX_MS, HostAuth, Refusal
from contracts.decision import PlacementPlan
from contracts.usage import MAX_REPLICAS, ReplicaUse
from contracts.process_end import MAX_ENDED, ProcessEnd
from scheduler.bounds import Labels, Name
from scheduler.cluster import GPUList
from scheduler.command_set import MAX_CHARS as MAX_COMMAND_SET
from scheduler.limits import MAX_BYTES, MAX_GPUS
from scheduler.naming import NAME_MAX, NAME_PATTERN

# their homes are small modules of their own (what the CLI reads without the rest; issue 37); re-exported here
from contracts.host_kinds import HOST_KINDS, host_kind  # noqa: F401
from contracts.kv_connectors import KV_CONNECTORS, MAX_KV_CONNECTORS, KVConnector, known_kv_connectors  # noqa: F401
from contracts.timings import CONTROL_QUEUE, Timings, host_queue  # noqa: F401


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
    # the processes that ended since the host workflow last acknowledged (contracts/process_end.py);
    # carried on the watch's return, not part of the inventory (the fingerprint leaves it out). None: none
    ended: list[ProcessEnd] | None = Field(None, max_length=MAX_ENDED)
    # who made it (contracts/host_auth.py): checked by the host workflow before the report counts;
    # not part of what its MAC covers, nor of the inventory (the fingerprint leaves it out)
    auth: HostAuth | None = None

    def fingerprint(self) -> str:
        import hashlib

        # a report without kv_connectors keeps the fingerprint it had before the field (recorded histories,
        # stored rows): an upgrade alone is no inventory change
        unset = ({"kv_connectors"} if self.kv_connectors is None else set()) | (
            {"foreign_degraded"} if self.foreign_degraded is None else set())
        return hashlib.sha256(self.model_dump_json(exclude={"agent_version", "boot", "usage", "ended", "auth", *unset}).encode()
                              ).hexdigest()[:16]


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
    """The orphan check's read of the ledger: asked by the agent of the reads workflow (query
    ``bookings``: untrusted, as any query's input), or run by the host workflow for its agent."""

    model_config = ConfigDict(extra="forbid")
    instances: list[Name] = Field(max_length=MAX_ASKED)
    worker: Name


class HeldAsk(BaseModel):
    """Whether the ledger holds exactly ``plan`` for ``instance``, a wanted replica (the instance
    workflow asks before it trusts a placement carried across continue-as-new)."""

    instance: Name
    plan: PlacementPlan
