"""The autoscaler's series on the control plane's registry (activities/metrics.py's)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class AutoscalerMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.desired = Gauge("gpuflow_autoscaler_desired_replicas", "Replicas the autoscaler last set (or kept).",
                             ["deployment"], registry=registry)
        self.decisions = Counter("gpuflow_autoscaler_decisions", "Autoscaler decisions, by direction and by the "
                                 "rule (or bound) that decided.", ["deployment", "direction", "rule"],
                                 registry=registry)
        self.blocked = Gauge("gpuflow_autoscaler_capacity_blocked", "1 while the replicas the autoscaler wants do not "
                             "all fit on the cluster (the scheduler's dry run).", ["deployment"], registry=registry)

        self.role_desired = Gauge("gpuflow_autoscaler_role_desired_replicas", "A prefill/decode group's replicas of "
                                  "one role the autoscaler last set (or kept).", ["deployment", "role"], registry=registry)
        self.role_decisions = Counter("gpuflow_autoscaler_role_decisions", "A group's per-role autoscaler decisions, by "
                                      "direction and the rule (or bound) that decided.",
                                      ["deployment", "role", "direction", "rule"], registry=registry)
        self.role_blocked = Gauge("gpuflow_autoscaler_role_capacity_blocked", "1 while the members of one role the "
                                  "autoscaler wants do not all fit on the cluster.", ["deployment", "role"],
                                  registry=registry)

    def observe_role(self, deployment: str, role: str, desired: int, direction: str, rule: str, blocked: bool) -> None:
        self.role_desired.labels(deployment, role).set(desired)
        self.role_decisions.labels(deployment, role, direction, rule).inc()
        self.role_blocked.labels(deployment, role).set(1 if blocked else 0)

    def observe(self, deployment: str, desired: int, direction: str, rule: str, blocked: bool) -> None:
        self.desired.labels(deployment).set(desired)
        self.decisions.labels(deployment, direction, rule).inc()
        self.blocked.labels(deployment).set(1 if blocked else 0)
