"""The operator's limits (settings: ``GPUFLOW_LIMITS__...``), as the control plane hands them to
the deployment workflow (the ``deployment_limits`` activity's answer). The absolute ceilings that
hold everywhere, whatever the operator says, are the policy's (scheduler/limits.py): a number
past them is refused with the field named before it reaches a workflow's history."""

from __future__ import annotations

from pydantic import BaseModel, Field

from contracts.timings import Timings
from scheduler.limits import REPLICAS_CEILING
from scheduler.spec_timings import spec_timings


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


class ClusterPolicy(Limits):
    """What the ``deployment_limits`` activity answers: the operator's limits and the cluster's
    timings (the answering ``gpuflow server``'s GPUFLOW_TIMINGS__*). A deployment takes its
    timings from here, with the per-deployment ones its spec sets (scheduler/spec_timings.py),
    never from the client that started it. ``timings`` None: an answer recorded before it (a
    replayed history) or a worker that holds no timings of its own: the workflow's input stands."""

    timings: Timings | None = None

    def timings_for(self, given: Timings, raw_spec: dict) -> Timings:
        """A deployment's timings: the cluster's (or ``given``, the workflow's input, when there
        are none here: a history recorded before, a worker without timings) with the spec's
        per-deployment ones over them; never the deploying client's environment."""
        base = self.timings if self.timings is not None else given
        return Timings(**{**base.model_dump(), **spec_timings(raw_spec)})


def cluster_timings(limits: Limits | None, given: Timings, raw_spec: dict) -> Timings:
    """A deployment's timings (``ClusterPolicy.timings_for``); ``given`` before the control plane
    answered, or when its answer is plain ``Limits``."""
    return limits.timings_for(given, raw_spec) if isinstance(limits, ClusterPolicy) else given
