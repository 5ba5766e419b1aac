"""The timings a spec may set for its own deployment (``timings:`` in a model spec). Every other
duration the workflows wait on (host heartbeats, the grace before an UNREACHABLE replica is
re-placed, the reconcile period, ...) is cluster policy: the control plane's settings
(``gpuflow server``'s GPUFLOW_TIMINGS__*) decide it for every deployment, whoever deployed
(contracts/limits.py ``ClusterPolicy``; ``gpuflow settings`` prints them).

These are per deployment because they are about the model and its engine, not the cluster: a
large model's load time, its engine's health probe, how long its requests take to drain. Each
has the cluster's bounds (contracts/timings.py ``Timings``); a field left out takes the cluster's."""

from __future__ import annotations

from pydantic import Field

from scheduler.fields import Strict
from scheduler.limits import MAX_WAIT_S


class DeploymentTimings(Strict):
    ready_timeout_s: float | None = Field(None, gt=0, le=MAX_WAIT_S, description=(
        "A launched engine must answer within this (a large model loads for long). Default: the cluster's."))
    settle_s: float | None = Field(None, ge=0, le=MAX_WAIT_S, description=(
        "A command without {port} is up once it has lived this long. Default: the cluster's."))
    liveness_s: float | None = Field(None, ge=0, le=MAX_WAIT_S, description=(
        "A RUNNING engine's health is probed this often; 0 disables. Default: the cluster's."))
    liveness_failures: int | None = Field(None, ge=1, le=1000, description=(
        "Missed probes in a row before the engine is restarted. Default: the cluster's."))
    restart_base_s: float | None = Field(None, ge=0, le=MAX_WAIT_S, description=(
        "Restart backoff: min(base * 2^(n-1), cap). Default: the cluster's."))
    restart_cap_s: float | None = Field(None, ge=0, le=MAX_WAIT_S, description=(
        "Restart backoff cap. Default: the cluster's."))
    drain_timeout_s: float | None = Field(None, ge=0, le=MAX_WAIT_S, description=(
        "Before a replica stops, its requests in flight get this long to finish. Default: the cluster's."))
    download_attempts: int | None = Field(None, ge=1, le=1000, description=(
        "Tries of a hub download before the replica is ERROR. Default: the cluster's."))

    def given(self) -> dict:
        """The fields the spec set."""
        return self.model_dump(exclude_none=True)


PER_DEPLOYMENT = tuple(DeploymentTimings.model_fields)


def spec_timings(raw: dict) -> dict:
    """The per-deployment timings a spec (as JSON, validated before) sets; {} for none."""
    got = raw.get("timings") if isinstance(raw, dict) else None
    return DeploymentTimings.model_validate(got).given() if got else {}
