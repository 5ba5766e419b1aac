"""What crosses Temporal between the control-plane workflows and activities: plain pydantic
models (no SQLModel, no I/O), so workflow modules can import them cheaply. Fields are added with
defaults, never removed, so running histories stay decodable."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

from scheduler.cluster import GPU, Claim, Subordinate
from scheduler.limits import MAX_BYTES, MAX_WAIT_S, REPLICAS_CEILING

CONTROL_QUEUE = "gpuflow-control"


def host_queue(worker: str) -> str:
    return f"gpuflow-host-{worker}"


class Timings(BaseModel):
    """Every duration the workflows wait on. Defaults are for production; tests shorten them."""

    host_heartbeat_s: float = Field(10.0, gt=0, description="An agent that misses heartbeats this long is lost. Default 10 s.")
    host_schedule_to_start_s: float = Field(15.0, gt=0, description="Work queued for a host nobody polls fails after this. Default 15 s.")
    unreachable_grace_s: float = Field(300.0, ge=0, description="UNREACHABLE this long, then the reservation is released and the instance re-placed. Default 300 s.")
    restart_base_s: float = Field(10.0, ge=0, description="Restart backoff: min(base * 2^(n-1), cap). Default 10 s.")
    restart_cap_s: float = Field(300.0, ge=0, description="Restart backoff cap. Default 300 s.")
    ready_timeout_s: float = Field(600.0, gt=0, description="A launched server must answer within this. Default 600 s.")
    settle_s: float = Field(3.0, ge=0, description="A command without {port} is up once it has lived this long. Default 3 s.")
    liveness_s: float = Field(10.0, ge=0, description="A RUNNING server's health is probed this often; 0 disables. Default 10 s.")
    liveness_failures: int = Field(3, ge=1, description="Missed probes in a row before the server is stopped and restarted. Default 3.")
    pending_recheck_s: float = Field(600.0, gt=0, description="Safety net: a PENDING instance re-decides at least this often. Default 600 s.")
    host_watch_s: float = Field(300.0, gt=0, description="The host watch activity reports back at least this often. Default 300 s.")
    reconcile_s: float = Field(30.0, gt=0, description="A deployment checks its instances' workflows this often. Default 30 s.")
    drain_timeout_s: float = Field(30.0, ge=0, description="Before a replica is stopped (scale-down, delete, new spec), gateways stop routing to it and its requests in flight get this long to finish; 0 stops at once. Default 30 s.")
    orphan_check_s: float = Field(60.0, gt=0, description="An agent stops processes whose instance is gone or placed on another host this often (and at start-up). Default 60 s.")
    download_attempts: int = Field(5, ge=1, description="Tries of a hub download (each resumes the last) before the instance is ERROR and restarts later. Default 5.")

    @model_validator(mode="after")
    def _bounded(self) -> "Timings":
        """Every figure at most 30 days (counts at most 1000): one past what a timedelta holds
        would fail the workflow's task, forever."""
        for k, v in self:
            if v > (1000 if isinstance(v, int) else MAX_WAIT_S):
                raise ValueError(f"timings.{k} is {v!r}: more than {'1000' if isinstance(v, int) else '30 days'}")
        return self


class PlacementPlan(BaseModel):
    worker: str
    gpu_indexes: list[int] = []
    claim: Claim = Claim()
    subordinates: list[Subordinate] = []
    cpus: str | None = None  # CPU pinning (spec cpu_pinning): the CPUs local to the GPUs, and their NUMA nodes
    numa_nodes: list[int] | None = None


class DecisionRecord(BaseModel):
    """The decide activity's result: kept whole in the workflow history, so the UI shows it."""

    scheduled: bool
    plan: PlacementPlan | None = None
    strategy: str | None = None
    score: float | None = None
    reasons: list[str] = []
    request: dict[str, Any] = {}
    decision: dict[str, Any] = {}
    workers_seen: int = 0
    generations: dict[str, int] = {}  # worker -> generation of the snapshot decided on


class ReserveResult(BaseModel):
    """What the ledger booked: the decided plan, or, when its snapshot had gone stale, the plan
    of a fresh decision made under the ledger's locks (``remade``)."""

    plan: PlacementPlan
    booked_now: bool
    remade: DecisionRecord | None = None


class EstimateRecord(BaseModel):
    model: str
    request: dict[str, Any]
    summary: str


class InstanceFields(BaseModel):
    """One instance as it is now: what the store keeps and the workflow's query answers."""

    name: str
    deployment: str
    model: str
    state: str
    reason: str = ""
    worker: str | None = None
    gpu_indexes: list[int] = []
    restarts: int = 0
    pid: int | None = None
    port: int | None = None
    address: str | None = None  # the host agent's advertised address; the server listens there on ``port``


class InstanceRecord(InstanceFields):
    """A state change, as the store records it (with a summary of the decision, if new)."""

    decision: dict[str, Any] | None = None
    model_source: str | None = None  # the source key; RUNNING means the worker holds its files
    model_file_state: str | None = None  # downloading | error: the worker's copy of the source is in this state


class InstanceView(InstanceFields):
    """The instance workflow's ``status`` query: the state with the last decision, whole."""

    decision: DecisionRecord | None = None
    subordinate_workers: list[str] = []  # the other workers a placement across several workers uses
    parts: dict[str, str] = {}  # its helper processes (instance@part: rpc-server, Ray) -> their worker


class InstanceInput(BaseModel):
    name: str
    deployment: str
    spec: dict[str, Any]
    timings: Timings = Timings()
    restarts: int = Field(0, ge=0, le=2**53)
    placement: PlacementPlan | None = None  # carried across continue-as-new
    decision: DecisionRecord | None = None  # likewise: the decision that placed it, for explain


class DeploymentInput(BaseModel):
    """``spec`` is plain JSON (so `temporal workflow start --input` works); it is validated in
    the workflow, and a bad one fails the workflow with the validation message."""

    spec: dict[str, Any]
    replicas: int | None = Field(None, ge=0, le=REPLICAS_CEILING)  # overrides spec.replicas when given
    timings: Timings | None = None
    instances: list[str] = Field([], max_length=2 * REPLICAS_CEILING)
    next_index: int = Field(0, ge=0, le=2**53)
    deleting: bool = False
    rollout: dict[str, Any] | None = None  # workflows/rollout_steps.py's RolloutState, across continue-as-new


class DeploymentView(BaseModel):
    name: str
    replicas: int
    instances: list[str]
    deleting: bool = False
    spec: dict[str, Any] = {}
    stopping: list[str] = []  # instances asked to stop that have not ended yet (draining, stopping)
    broken: str = ""  # set by `gpuflow delete` when the workflow did not answer and was terminated


class HostReport(BaseModel):
    """What an agent reports about its host."""

    name: str
    cluster: str = "default"
    labels: dict[str, str] = {}
    ram_total: int = Field(ge=0, le=MAX_BYTES)
    unified_memory: bool = False
    reserved_ram: int = Field(0, ge=0, le=MAX_BYTES)
    reserved_vram: int = Field(0, ge=0, le=MAX_BYTES)
    backends: list[str] | None = None
    gpus: list[GPU] = []
    simulated: bool = False
    agent_version: str = ""

    def fingerprint(self) -> str:
        import hashlib

        return hashlib.sha256(self.model_dump_json(exclude={"agent_version"}).encode()).hexdigest()[:16]


class HostInput(BaseModel):
    name: str
    timings: Timings = Timings()
    report: HostReport | None = None
    state: str = "not_ready"


class HostView(BaseModel):
    name: str
    state: str
    report: HostReport | None = None
    since: str = ""
    reason: str = ""  # why it is "broken": its workflow does not answer (gpuflow hosts)


class ClosedInstance(BaseModel):
    """An instance whose workflow is no longer running; ``worker`` may still run its process."""

    name: str
    status: str
    worker: str | None = None
    hosts: list[str] = []  # every worker its placement held (the main worker first)


class ScaleDownOrder(BaseModel):
    order: list[str]
    ranking: list[dict[str, Any]] = []
