"""The deployment workflow's contract (workflows/deployment.py): its input and status
(``DeploymentInput``, ``DeploymentView``) and its messages, one model each, validated as they
arrive: anyone who can reach Temporal can send them. Its rollout's state and query are in
contracts/rollout.py, and ``update_spec`` takes a model spec (scheduler/spec.py ``ModelSpec``).

Apart from contracts/control.py (which re-exports the input and the status) so that ``gpuflow
deploy`` starts without the control plane's other contracts, the host's report, the booking and the
decision types (about a tenth of its imports, paid by each of the ten processes the bench's CLI mode
starts at once; issue 37). Imports only ``scheduler``, contracts/rollout.py and contracts/timings.py."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from contracts.rollout import RolloutState
from contracts.timings import Timings
from scheduler.bounds import Count, Flag, Name, ShortText, Whole
from scheduler.limits import REPLICAS_CEILING


class ScaleAsk(BaseModel):
    """The ``scale`` update: the replica count wanted, ``{"replicas": 3}``. A bare whole number
    (``3``) is the same ask: what ``gpuflow scale``, the autoscaler and ``temporal workflow update
    --name scale --input 3`` send, and what histories before this model recorded."""

    model_config = ConfigDict(extra="forbid")
    TAKES: ClassVar[str] = 'one whole number of replicas >= 0 (or {"replicas": n})'

    replicas: Whole = Field(ge=0, le=REPLICAS_CEILING)

    @model_validator(mode="before")
    @classmethod
    def bare_number(cls, v: object) -> object:
        return v if isinstance(v, dict) else {"replicas": v}

    @field_validator("replicas", mode="before")
    @classmethod
    def whole(cls, v: object) -> object:
        """Refused naming what it was: the converter would read ``true`` as 1 and ``"3"`` as 3."""
        if type(v) is not int or v < 0:
            raise ValueError(f"not a whole number >= 0 (true, \"3\" and 3.0 are not), got {str(v)[:20]!r} "
                             f"({type(v).__name__})")
        if v > REPLICAS_CEILING:
            raise ValueError(f"replicas {v} is more than the ceiling of {REPLICAS_CEILING}")
        return v


class InstanceEnded(BaseModel):
    """The ``instance_ended`` signal, from a replica's workflow as it ends: one of this deployment's
    replicas (``<deployment>-<n>``). A bare instance name reads as one: what replicas sent before
    this model, and what a history recorded then replays."""

    model_config = ConfigDict(extra="forbid")

    instance: Name

    @model_validator(mode="before")
    @classmethod
    def bare_name(cls, v: object) -> object:
        return {"instance": v} if isinstance(v, str) else v


class DeploymentInput(BaseModel):
    """``spec`` is plain JSON (so `temporal workflow start --input` works); it is validated in
    the workflow, and a bad one fails the workflow with the validation message."""

    spec: dict[str, Any]
    replicas: Whole | None = Field(None, ge=0, le=REPLICAS_CEILING)  # overrides spec.replicas when given
    timings: Timings | None = None
    instances: list[Name] = Field([], max_length=2 * REPLICAS_CEILING)
    next_index: Count = 0
    deleting: Flag = False
    rollout: RolloutState | None = None  # the rollout's state, across continue-as-new (contracts/rollout.py)
    members: dict[Name, ShortText] = Field({}, max_length=3 * REPLICAS_CEILING)  # a group's: member -> role
    forming: list[Name] = Field([], max_length=3 * REPLICAS_CEILING)  # a group's members named, not formed yet
    degraded: list[ShortText] = Field([], max_length=8)  # a group's degradations at its formation (gather_unmet)


class DeploymentView(BaseModel):
    name: str
    replicas: int
    instances: list[str]
    deleting: bool = False
    spec: dict[str, Any] = {}
    stopping: list[str] = []  # instances asked to stop that have not ended yet (draining, stopping)
    broken: str = ""  # set by `gpuflow delete` when the workflow did not answer and was terminated
    members: dict[str, str] = {}  # a prefill/decode group's: every member named -> its role
    forming: list[str] = []  # a group's members named, not booked yet (no workflow): each waits PENDING with ``waiting``
    waiting: str = ""  # why the group (or a role's new member) is not placed yet, naming the role
    degraded: list[str] = []  # a group's degradations at its formation (gather_unmet: looser than its gather layer)
    degraded_why: dict[str, str] = {}  # why a degradation was raised, where its check said (pd_ineffective's words)
