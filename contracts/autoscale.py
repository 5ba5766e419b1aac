"""What the autoscaler's workflow and activities exchange (names, inputs, one step's result):
activities/autoscale.py runs them, workflows/autoscaler.py calls them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from scheduler.bounds import Name

AUTOSCALE_STEP = "autoscale_step"
AUTOSCALE_APPLY = "autoscale_apply"
START_AUTOSCALER = "start_autoscaler"
HISTORY = 50  # decisions kept, and shown by `gpuflow autoscale`


class AutoscalerInput(BaseModel):
    deployment: Name
    history: list[dict[str, Any]] = Field([], max_length=HISTORY)  # the last HISTORY decisions, newest last
    carry: dict[str, Any] = {}  # activities/autoscale_state.py
    # the last 10: {at, decision_to_running_s} (the 0 -> 1 decision to the step that saw a replica
    # RUNNING) and {at, request_to_first_token_s} (the gateways' gpuflow_gateway_cold_start_seconds)
    cold_starts: list[dict[str, Any]] = Field([], max_length=10)


class DeploymentRef(BaseModel):
    """The deployment whose autoscaler to start (once: a running one is kept)."""

    deployment: Name


class StepAsk(BaseModel):
    """One interval of ``deployment``'s autoscaler: what it carried from the last (validated by
    activities/autoscale_state.py) and the workflow's clock, in epoch seconds."""

    deployment: Name
    carried: dict[str, Any] = {}
    now: float = Field(ge=0, le=1e11)


class ApplyAsk(BaseModel):
    """Set ``deployment``'s replicas to ``replicas`` (absolute); with ``role``, that role's replicas
    of a prefill/decode group (the deployment's ``scale_role`` update)."""

    deployment: Name
    replicas: int = Field(le=2**31)  # the step's target; the deployment's ``scale`` update checks it (ScaleRefused)
    role: Literal["prefill", "decode"] | None = None


class RoleStep(BaseModel):
    """One role's outcome in a group's interval: its replicas now and the absolute count to set."""

    role: Literal["prefill", "decode"]
    current: int = Field(0, ge=0, le=2**31)
    target: int = Field(0, ge=0, le=2**31)
    blocked: bool = False  # some of the members it wanted do not fit
    reasons: list[str] = Field([], max_length=50)  # the scheduler's, for the first that does not fit
    record: dict[str, Any] = {}


class Step(BaseModel):
    """One interval's outcome. ``done``: the autoscaler has nothing left to do (the reason)."""

    done: str = ""
    carry: dict[str, Any] = {}
    record: dict[str, Any] = {}
    current: int = 0
    target: int = 0  # the absolute replica count to set
    blocked: bool = False  # some of the replicas the policy wanted do not fit
    reasons: list[str] = []  # the scheduler's, for the first that does not fit
    interval_s: float = 15.0
    roles: list[RoleStep] = Field([], max_length=2)  # a group's: each autoscaled role's step (then target is unused)


class AutoscaleView(BaseModel):
    """The ``autoscale`` query's answer."""

    deployment: str
    desired: int | None = None
    capacity_blocked: bool = False
    blocked_reasons: list[str] = []
    ended: str = ""
    history: list[dict[str, Any]] = []
    cold_starts: list[dict[str, Any]] = []
    roles: list[dict[str, Any]] = []  # a group's: {role, desired, capacity_blocked, blocked_reasons} per autoscaled role
