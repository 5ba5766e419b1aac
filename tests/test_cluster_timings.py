"""A deployment's timings (contracts/limits.py ClusterPolicy, cluster_timings): the control plane's,
with the per-deployment ones its spec sets (scheduler/spec_timings.py); the workflow's input only
where the control plane's answer holds none (a history recorded before, a worker without timings)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from contracts.host import Timings
from contracts.limits import ClusterPolicy, Limits, cluster_timings
from scheduler.spec import ModelSpec
from scheduler.spec_timings import PER_DEPLOYMENT

CLUSTER = Timings(unreachable_grace_s=300, ready_timeout_s=600)  # the server's settings
CLIENT = Timings(unreachable_grace_s=1, ready_timeout_s=7)  # what an old CLI's environment put in the input
SPEC = {"name": "m", "timings": {"ready_timeout_s": 45}}


# (what the control plane answered, the spec) -> (unreachable_grace_s, ready_timeout_s)
@pytest.mark.parametrize("answer,raw,want", [
    (ClusterPolicy(timings=CLUSTER), {"name": "m"}, (300, 600)),  # the cluster's; the client's 1 and 7 ignored
    (ClusterPolicy(timings=CLUSTER), SPEC, (300, 45)),  # the spec's own ready_timeout_s over the cluster's
    (ClusterPolicy(), SPEC, (1, 45)),  # a worker without timings: the input's, the spec's over them
    (Limits(), {"name": "m"}, (1, 7)),  # an answer recorded before ClusterPolicy (replay): the input's, as then
    (None, SPEC, (1, 7)),  # before the control plane answered: the input's
])
def test_cluster_timings(answer, raw, want):
    t = cluster_timings(answer, CLIENT, raw)
    assert (t.unreachable_grace_s, t.ready_timeout_s) == want


def test_a_recorded_answer_without_timings_reads_as_none():
    assert ClusterPolicy.model_validate({"max_replicas": 256, "estimate_timeout_s": 120.0}).timings is None


@pytest.mark.parametrize("timings,field", [
    ({"unreachable_grace_s": 1}, "unreachable_grace_s"),  # cluster policy: not the spec's
    ({"host_heartbeat_s": 1}, "host_heartbeat_s"),
    ({"ready_timeout_s": 0}, "ready_timeout_s"),  # > 0
    ({"liveness_failures": 0}, "liveness_failures"),  # >= 1
])
def test_a_spec_may_set_only_the_per_deployment_timings(timings, field):
    base = {"name": "m", "source": {"local_path": "/m"}, "backend": "custom", "run_command": "x"}
    with pytest.raises(ValidationError, match=field):
        ModelSpec.model_validate(base | {"timings": timings})


def test_per_deployment_are_timings():
    assert set(PER_DEPLOYMENT) < set(Timings.model_fields)
    assert set(PER_DEPLOYMENT) == {"ready_timeout_s", "settle_s", "liveness_s", "liveness_failures", "restart_base_s",
                                   "restart_cap_s", "drain_timeout_s", "download_attempts"}
