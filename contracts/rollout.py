"""The rollout's probe of its replicas (activities/rollout_probe.py runs it; the deployment
workflow reads it between rollout steps, workflows/rollout_steps.py)."""

from __future__ import annotations

from pydantic import BaseModel, Field

ROLLOUT_PROBE = "rollout_probe"


class ReplicaProbe(BaseModel):
    name: str
    state: str  # the instance's state, or "gone" when its workflow does not answer
    reason: str = ""
    restarts: int = 0
    answers: bool = False  # RUNNING and its server answered HTTP (any status below 500)


class ReplicaProbes(BaseModel):
    """The probe's answer: one ReplicaProbe per name asked (contracts/control.py InstanceNames)."""

    probes: list[ReplicaProbe] = Field([], max_length=10_000)
