"""What crosses Temporal between the control-plane workflows and activities: plain pydantic
models (no SQLModel, no I/O), so workflow modules can import them cheaply. Here: the workflows'
inputs and views, the instance's records, preemption notices and host news, and the results the
placement activities return. The deployment's input and view are contracts/deployment.py's (the
CLI's ``gpuflow deploy`` imports them alone), re-exported here; the decision itself is in
contracts/decision.py; each activity's input is in the file of its concern (contracts/placement.py,
records.py, hosts.py, queue.py, drain.py, autoscale.py, rollout.py)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contracts.agent import KEY_ID_PATTERN, PDModeName
from contracts.booking_proof import BookingProof
from contracts.deployment import DeploymentInput, DeploymentView  # noqa: F401  (their home; re-exported)
from contracts.decision import DecisionRecord, PlacementPlan, RequestSummary, Victim  # noqa: F401  (their home; re-exported)
from contracts.host import CONTROL_QUEUE, HostInput, HostReport, Timings, host_queue  # noqa: F401  (their home; re-exported)
from contracts.host import CordonReason
from contracts.host_auth import Refusal
from scheduler.bounds import Count, Indexes, Name, Pid, Port, ShortText, Text
from scheduler.limits import MAX_GPUS, REPLICAS_CEILING
from scheduler.naming import NAME_MAX


class PreemptNotice(BaseModel):
    """To a victim: who took its GPUs, and why (its reason while it waits PENDING)."""

    by: Annotated[str, Field(max_length=300)]  # tenant/instance of the preemptor
    instance: Name  # the preemptor's instance name (it waits for the victim's process to stop)
    why: Annotated[str, Field(max_length=300)] = ""

    @property
    def reason(self) -> str:
        return f"preempted by {self.by} {self.why}".rstrip()


class VictimStopped(BaseModel):
    """To a preemptor, from a victim whose processes stopped (it may launch on their GPUs once every
    victim said so). A bare instance name reads as one: what victims sent before this model, and
    what a history recorded then replays."""

    instance: Name  # the victim's instance name

    @model_validator(mode="before")
    @classmethod
    def bare_name(cls, v: object) -> object:
        return {"instance": v} if isinstance(v, str) else v


class HostNews(BaseModel):
    """What the host's watch learned (activities/hosts.py: host_lost, host_seen). ``lost``: the
    agent stopped answering. ``restarted``: a new agent run said hello (it supervises the processes
    it adopts once each instance asks it to). ``exited``: the process ``key`` (``pid``) ended, as
    the host's signed report said (contracts/process_end.py)."""

    host: Name
    kind: Literal["lost", "restarted", "exited"]
    why: Annotated[str, Field(max_length=500)] = ""
    key: Annotated[str, Field(max_length=NAME_MAX + 41)] = ""  # exited: the process key
    pid: int = Field(0, ge=0, le=2**31)  # exited: its pid
    returncode: int | None = Field(None, ge=-(2**31), le=2**31)  # exited: its exit code, when the agent started it


class ReserveResult(BaseModel):
    """What the ledger booked (the decided plan), and whether this call booked it."""

    plan: PlacementPlan
    booked_now: bool


class EstimateRecord(BaseModel):
    """The estimate activity's result: the model's request in figures, and in words."""

    model: str
    request: RequestSummary
    summary: str


class PlaceResult(BaseModel):
    """The place activity's result: the decision, and the booking when it placed the replica
    (none when it does not fit, is over a quota, or is to be placed by preemption)."""

    decision: DecisionRecord
    booked: ReserveResult | None = None
    estimate: EstimateRecord | None = None  # the request it decided with (the workflow skips its own estimate when the spec states it)
    proof: BookingProof | None = None  # the booking signed for its host (contracts/booking_proof.py): its first launch's check


class InstanceFields(BaseModel):
    """One instance as it is now: what the store keeps and the workflow's query answers."""

    name: Name
    deployment: Name
    model: Annotated[str, Field(max_length=NAME_MAX)]
    state: ShortText
    reason: Text = ""
    worker: Name | None = None
    gpu_indexes: Indexes = []
    restarts: Count = 0
    pid: Pid | None = None
    port: Port | None = None
    address: ShortText | None = None  # the host agent's advertised address; the server listens there on ``port``
    kv_events_port: Port | None = None  # its engine publishes KV-cache events there (ZMQ), on ``address``
    bootstrap_port: Port | None = None  # its engine's KV hand-off port on ``address`` (LaunchResult.bootstrap_port)


class InstanceRecord(InstanceFields):
    """A state change, as the store records it (with a summary of the decision, if new)."""

    decision: dict[str, Any] | None = None
    model_source: Text | None = None  # the source key; RUNNING means the worker holds its files
    model_file_state: ShortText | None = None  # downloading | error: the worker's copy of the source is in this state
    # its engine key's nonce (LaunchResult.key_id): the store makes the key from it and the host's
    # credential (store/records.py), for the gateways; the key itself never crosses Temporal
    key_id: str | None = Field(None, pattern=KEY_ID_PATTERN, max_length=64)
    # its launch's MAC (LaunchResult.mac): a RUNNING record with a port or an address is written only
    # when it verifies with the booked host's credential (store/engine_keys.py check_launches)
    launch_mac: str = Field("", pattern=r"^([0-9a-f]{64})?$", max_length=64)


class InstanceView(InstanceFields):
    """The instance workflow's ``status`` query: the state with the last decision, whole."""

    decision: DecisionRecord | None = None
    subordinate_workers: list[str] = []  # the other workers a placement across several workers uses
    parts: dict[str, str] = {}  # its helper processes (instance@part: rpc-server, Ray) -> their worker


class InstanceInput(BaseModel):
    name: Name
    deployment: Name
    spec: dict[str, Any]
    timings: Timings = Timings()
    restarts: Count = 0
    placement: PlacementPlan | None = None  # carried across continue-as-new (or a group member's: booked whole)
    decision: DecisionRecord | None = None  # likewise: the decision that placed it, for explain
    group: Name | None = None  # a prefill/decode group's member: its deployment, which booked the group whole
    role: ShortText | None = None  # and its role (prefill, decode, router)
    pd_mode: PDModeName | None = None  # and the group's disaggregation.mode: the agent adds its flags and ports


class HostView(BaseModel):
    name: str
    state: str
    report: HostReport | None = None
    since: str = ""
    reason: str = ""  # why it is "broken": its workflow does not answer (gpuflow hosts)
    cordoned: bool = False  # an operator cordoned it: no new replicas there (its running ones stay)
    cordon_reason: str = ""
    refusal: Refusal | None = None  # the last report its workflow refused (contracts/host_auth.py)


class CordonAsk(BaseModel):
    """The host workflow's ``cordon`` update: the operator's reason, optional (contracts/host.py
    says which characters it may hold)."""

    model_config = ConfigDict(extra="forbid")
    TAKES: ClassVar[str] = 'nothing or one JSON object {"reason": "..."}'

    reason: CordonReason = ""


class ClosedInstance(BaseModel):
    """An instance whose workflow is no longer running; ``worker`` may still run its process."""

    name: str
    status: str
    worker: str | None = None
    hosts: list[str] = []  # every worker its placement held (the main worker first)


class ScaleDownOrder(BaseModel):
    order: list[str]
    ranking: list[dict[str, Any]] = []


class InstanceNames(BaseModel):
    """Some instances, by name: the victims still to stop, the replicas whose workflows to look
    at (records.closed_workflows, rollout_probe)."""

    names: list[Name] = Field([], max_length=2 * REPLICAS_CEILING + MAX_GPUS * 4)


class InstanceRef(BaseModel):
    instance: Name


class ClosedInstances(BaseModel):
    """records.closed_workflows' answer: those of the instances asked about whose workflows ended."""

    closed: list[ClosedInstance] = []
