"""The deployment workflow's messages (workflows/deployment.py), one model each, validated as they
arrive: anyone who can reach Temporal can send them. Its input and status are in contracts/control.py
(DeploymentInput, DeploymentView), its rollout's state and query in contracts/rollout.py, and
``update_spec`` takes a model spec (scheduler/spec.py ``ModelSpec``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from scheduler.bounds import Name, Whole
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
