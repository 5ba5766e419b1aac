"""How big a deployment may be: absolute ceilings that hold everywhere (the spec's validation)
and the operator's maximum (settings: ``GPUFLOW_LIMITS__MAX_REPLICAS``). A number past these is
refused with the field named, before it reaches a workflow's history (where 100,000 replicas
once failed every workflow task with PayloadsTooLarge, forever)."""

from __future__ import annotations

from pydantic import BaseModel, Field

REPLICAS_CEILING = 4096  # no operator setting goes above this
MAX_BYTES = 2**50  # 1 PiB: more memory than any one machine (or replica) has
MAX_GPUS = 1024  # GPUs per replica, GPU ids in a selector
MAX_WAIT_S = 30 * 86400.0  # any duration in Timings: 30 days


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
