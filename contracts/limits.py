"""The operator's limits (settings: ``GPUFLOW_LIMITS__...``), as the control plane hands them to
the deployment workflow (the ``deployment_limits`` activity's answer). The absolute ceilings that
hold everywhere, whatever the operator says, are the policy's (scheduler/limits.py): a number
past them is refused with the field named before it reaches a workflow's history."""

from __future__ import annotations

from pydantic import BaseModel, Field

from scheduler.limits import REPLICAS_CEILING


class Limits(BaseModel):
    """The operator's limits, read by the control plane (the server's settings decide)."""

    max_replicas: int = Field(256, ge=1, le=REPLICAS_CEILING,
                              description=f"Most replicas one deployment may ask for (1..{REPLICAS_CEILING}). Default 256.")

    estimate_timeout_s: float = Field(120.0, gt=0, le=3600,
                                      description="An estimate (reading a model's header and costing it) is "
                                                  "stopped after this many seconds. Default 120 s.")

    def replicas_problem(self, n: int) -> str | None:
        """Why ``n`` replicas are refused, or None."""
        if n > self.max_replicas:
            return (f"replicas {n} is more than this cluster's maximum of {self.max_replicas} "
                    "(the operator's GPUFLOW_LIMITS__MAX_REPLICAS, set where the control-plane workers run)")
        return None
