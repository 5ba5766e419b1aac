"""Preemption for a prefill/decode group, whole (scheduler/tenancy/group_preempt.py), as a table.
The cluster: two hosts a and b, two 24 GiB GPUs each; every member and every running replica holds
20 GiB of one GPU, so a GPU holds one of them. A group of 1 prefill + 1 decode needs 2 GPUs."""

from __future__ import annotations

import pytest

from scheduler.cluster import Claim, Instance
from scheduler.groups.spec import RoleName
from scheduler.request import FlatRequest
from scheduler.spec import ModelSpec
from scheduler.tenancy.config import TenantsFile
from scheduler.tenancy.group_preempt import plan_group
from scheduler.tenancy.preemption import Owners
from scheduler.units import GiB
from tests.conftest import cluster, gpu, worker

TENANTS = TenantsFile.model_validate({"tenants": [
    {"name": "lab", "guarantee": {"gpus": 2}}, {"name": "small", "guarantee": {"gpus": 1}}, {"name": "poc"}]})
REQ = {RoleName.PREFILL: FlatRequest(vram=20 * GiB), RoleName.DECODE: FlatRequest(vram=20 * GiB)}
HOSTS = [worker("a", 64, [gpu(0, 24), gpu(1, 24)]), worker("b", 64, [gpu(0, 24), gpu(1, 24)])]


def group(name="pd", tenant="lab", priority=0):
    return ModelSpec.model_validate({
        "name": name, "backend": "custom", "run_command": "serve {port}", "source": {"local_path": "/m"},
        "resources": {"vram": "20 GiB", "ram": 0}, "disaggregation": {"mode": "custom"}, "tenant": tenant,
        "priority": priority, "roles": [{"name": "prefill"}, {"name": "decode"}]})


def held(name, model, w, g):
    return Instance(name=name, model=model, worker=w, gpu_indexes=[g], claim=Claim(vram={g: 20 * GiB}))


FULL = [held("x-0", "x", "a", 0), held("x-1", "x", "a", 1), held("x-2", "x", "b", 0), held("x-3", "x", "b", 1)]


@pytest.mark.parametrize("tenant_of, priority_of, started, victims, why", [
    # poc borrows 4 GPUs (no guarantee); lab's group (2 GPUs) is within lab's guarantee of 2: the two most
    # recently started of poc's replicas give way (x-3 at 4 s, x-2 at 3 s), the group formed on host b
    ({"x": "poc", "pd": "lab"}, {}, {"x-0": 1, "x-1": 2, "x-2": 3, "x-3": 4}, ["x-2", "x-3"], "to reclaim lab's guarantee"),
    # started the other way round: x-0 and x-1 go, both on host a
    ({"x": "poc", "pd": "lab"}, {}, {"x-0": 4, "x-1": 3, "x-2": 2, "x-3": 1}, ["x-0", "x-1"], "to reclaim lab's guarantee"),
    # the group's tenant small is guaranteed 1 GPU: the group's 2 would borrow; poc is not its own: no victim
    ({"x": "poc", "pd": "small"}, {}, {}, None, ""),
    # within one tenant, by priority: x (priority 0) gives way to the group (priority 5)
    ({"x": "poc", "pd": "poc"}, {"pd": 5}, {"x-0": 1, "x-1": 2, "x-2": 3, "x-3": 4}, ["x-2", "x-3"],
     "for a higher-priority deployment of its tenant"),
])
def test_a_group_takes_room_for_every_member_or_nothing(tenant_of, priority_of, started, victims, why):
    spec = group(tenant=tenant_of["pd"], priority=priority_of.get("pd", 0))
    p = plan_group(cluster(HOSTS, FULL), spec, REQ, TENANTS, Owners(tenant_of, priority_of, started), {"pd-0", "pd-1"})
    if victims is None:
        assert p.group is None and p.victims == [] and p.reasons[0].startswith("preemption:")
        return
    assert sorted(p.victims) == victims and p.why == why
    assert p.group.scheduled and len(p.group.members) == 2
    freed = {(v.worker, v.gpu_indexes[0]) for v in FULL if v.name in victims}
    assert {(m.worker, m.gpu_indexes[0]) for m in p.group.members} == freed  # exactly the victims' GPUs


def test_one_gpu_is_never_enough_for_a_group_of_two():
    # 3 GPUs held by lab's own older deployment at priority 9 (not preemptible by priority 5), one by poc:
    # taking poc's one GPU would place one member, not the group: nothing is taken
    insts = FULL[:3] + [held("y-0", "y", "b", 1)]
    owners = Owners({"x": "lab", "y": "poc", "pd": "lab"}, {"x": 9, "pd": 5}, {})
    p = plan_group(cluster(HOSTS, insts), group(priority=5), REQ, TENANTS, owners, {"pd-0", "pd-1"})
    assert p.group is None and p.victims == []
