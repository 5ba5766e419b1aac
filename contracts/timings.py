"""The task queues' names and the workflows' timings (``Timings``): what every side of Temporal
reads, the CLI's ``gpuflow deploy`` among them. Kept apart from contracts/host.py, which re-exports
them, so that a deployment's input (contracts/deployment.py) does not bring the host's report,
its booking and the decision types with it: ``gpuflow deploy`` starts without them (issue 37).
Imports only pydantic and scheduler/limits.py."""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

from scheduler.limits import MAX_WAIT_S

CONTROL_QUEUE = "gpuflow-control"


def host_queue(worker: str) -> str:
    return f"gpuflow-host-{worker}"


class Timings(BaseModel):
    """Every duration the workflows wait on. Defaults are for production; tests shorten them."""

    host_heartbeat_s: float = Field(10.0, gt=0, le=MAX_WAIT_S, description="An agent that misses heartbeats this long is lost. Default 10 s.")
    supervise_heartbeat_s: float = Field(300.0, gt=0, le=MAX_WAIT_S, description="Read by nothing since the host agent supervises its processes itself and its watch reports their ends (a supervisor activity heartbeated within this); kept so settings that name it still validate. Default 300 s.")
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
