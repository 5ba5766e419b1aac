"""Guarantees in whole replicas (issue 25), in tables: a tenant within its guarantee gets its
replicas placed as on an empty cluster of its guarantee's size (whole GPUs, by preemption),
never in slivers of what partly full GPUs have left; and a group of replicas preempts at once,
its victims minimal together (Kueue's fill-back over the group), and the queue wakes every
replica the guarantee covers in one pass.

The cluster of the brief: one host, 8 GPUs of 24 GiB; poc (limit 2) and dev (limit 6) hold one
20 GiB replica on each GPU, so every GPU has 4 GiB left and a 20 GiB replica fits only as
5 x 4 GiB. The engine declares that it splits ({gpu_indexes}), so the slivers are offered."""

from __future__ import annotations

import pytest

from scheduler.cluster import Claim, Instance
from scheduler.request import FlatRequest
from scheduler.spec import ModelSpec
from scheduler.tenancy.admit import admit
from scheduler.tenancy.config import TenantsFile
from scheduler.tenancy.group import admit_group
from scheduler.tenancy.preemption import Owners
from scheduler.tenancy.queue import Quotas, Waiting, to_wake
from scheduler.tenancy.usage import by_tenant, of_candidate
from scheduler.units import GiB
from tests.conftest import cluster, gpu, worker

TENANTS = TenantsFile.model_validate({"tenants": [
    {"name": "prod", "priority": 100, "guarantee": {"gpus": 4}},
    {"name": "dev", "priority": 30, "limit": {"gpus": 6}},
    {"name": "poc", "priority": 10, "limit": {"gpus": 2}},
    {"name": "lab", "priority": 100}]})  # no guarantee
REQ = FlatRequest(vram=20 * GiB, ram=0)
OWNERS = Owners({"poc-m": "poc", "dev-m": "dev", "prod-m": "prod", "lab-m": "lab"}, {}, {})


def spec(name):
    return ModelSpec.model_validate({"name": name, "backend": "custom", "run_command": "serve {port} {gpu_indexes}",
                                     "source": {"local_path": "/m"}, "resources": {"vram": "20 GiB", "ram": 0}})


def held(name, model, g, gib=20, w="h"):
    gs = g if isinstance(g, list) else [g]
    return Instance(name=name, model=model, worker=w, gpu_indexes=gs,
                    claim=Claim(vram={i: gib * GiB // len(gs) for i in gs}))


def full(prod: int) -> list[Instance]:
    """prod holds GPUs 0..prod-1 whole; poc the next 2, dev the rest (started in that order)."""
    out = [held(f"prod-m-{k}", "prod-m", k) for k in range(prod)]
    rest = list(range(prod, 8))
    out += [held(f"poc-m-{k}", "poc-m", g) for k, g in enumerate(rest[:2])]
    out += [held(f"dev-m-{k}", "dev-m", g) for k, g in enumerate(rest[2:])]
    return out


def started(insts):
    return Owners(OWNERS.tenant_of, {}, {i.name: float(n) for n, i in enumerate(insts)})


@pytest.mark.parametrize("tenant, prod_holds, victims, gpus", [
    # prod uses 0 + 1 whole GPU <= 4: whole by preemption, poc's newest first (lowest priority, newest)
    ("prod", 0, ["poc-m-1"], 1),
    # prod uses 3 + 1 = 4 <= 4: still within its guarantee, whole
    ("prod", 3, ["poc-m-1"], 1),
    # prod uses 4 + 1 = 5 > 4: it would borrow, so no preemption; the slivers stand (5 GPUs x 4 GiB)
    ("prod", 4, [], 5),
    # lab has no guarantee: whatever it uses it borrows; slivers, no preemption
    ("lab", 0, [], 5),
])
def test_within_its_guarantee_a_replica_takes_whole_gpus(tenant, prod_holds, victims, gpus):
    insts = full(prod_holds)
    snap = cluster([worker("h", 256, [gpu(i, 24) for i in range(8)])], insts)
    a = admit(snap, spec(f"{tenant}-m"), REQ, TENANTS, started(insts), f"{tenant}-m-9")
    assert a.decision.scheduled and a.quota is None
    assert a.victims == victims
    assert len(a.decision.placement.gpu_indexes) == gpus == of_candidate(a.decision.placement).gpus
    if victims:  # the victim's GPU, whole: as on an empty cluster of 4 GPUs
        assert a.decision.placement.gpu_indexes == next(i.gpu_indexes for i in insts if i.name == victims[0])
        assert a.preemption.why == "to reclaim prod's guarantee"


def test_the_guarantee_covers_four_replicas_at_once():
    # prod asks for 4 with none placed: the group takes poc's 2 (borrowing, lowest priority, newest
    # first) then dev's 2 newest; each replica one whole GPU, no victim taken twice; 0 + 4 x 1 = 4
    insts = full(0)
    snap = cluster([worker("h", 256, [gpu(i, 24) for i in range(8)])], insts)
    names = [f"prod-m-{k}" for k in range(4)]
    adms = admit_group(snap, spec("prod-m"), REQ, TENANTS, started(insts), names)
    assert [a.victims for a in adms] == [["poc-m-1"], ["poc-m-0"], ["dev-m-5"], ["dev-m-4"]]
    assert [a.decision.placement.gpu_indexes for a in adms] == [[1], [0], [7], [6]]
    # a fifth would take prod to 5 > 4: the slivers are all that is left to it, and they are gone too
    adms = admit_group(snap, spec("prod-m"), REQ, TENANTS, started(insts), names + ["prod-m-4"])
    assert sum(len(a.victims) for a in adms) == 4 and not adms[4].victims


def test_fill_back_over_the_group_spares_a_victim_one_replica_at_a_time_would_take():
    # GPUs 0-2 of 24 GiB. poc holds GPU 0 (20 GiB); dev holds GPUs 1 and 2 with one 40 GiB replica.
    # prod (guarantee 4) asks for 2. One at a time: replica 1 takes poc's (poc first: priority 10 <
    # 30), replica 2 then needs dev's. Over the group: without poc's victim both replicas fit on the
    # two GPUs dev's replica frees, so poc's is spared: 1 victim, not 2.
    insts = [held("poc-m-0", "poc-m", 0), held("dev-m-0", "dev-m", [1, 2], gib=40)]
    snap = cluster([worker("h", 256, [gpu(i, 24) for i in range(3)])], insts)
    one_by_one = [admit(snap, spec("prod-m"), REQ, TENANTS, started(insts), "prod-m-0").victims]
    assert one_by_one == [["poc-m-0"]]
    adms = admit_group(snap, spec("prod-m"), REQ, TENANTS, started(insts), ["prod-m-0", "prod-m-1"])
    assert [a.victims for a in adms] == [["dev-m-0"], []]
    assert sorted(g for a in adms for g in a.decision.placement.gpu_indexes) == [1, 2]


@pytest.mark.parametrize("prod_holds, dev_guarantee, woken", [
    (0, None, 4),  # 0 + 4 x 1 GPU = 4 <= 4, and poc and dev borrow: every replica the guarantee covers
    (3, None, 1),  # 3 + 1 = 4: one more; 3 + 2 = 5 > 4
    (4, None, 0),  # at its guarantee: preempting would make it borrow
    (0, 6, 4),     # dev within its guarantee (6 <= 6), but poc borrows: preemption may help, all 4 woken (2 find victims)
])
def test_the_queue_wakes_every_replica_the_guarantee_covers_at_once(prod_holds, dev_guarantee, woken):
    tf = TENANTS
    if dev_guarantee:
        tf = TenantsFile.model_validate({"tenants": [
            {"name": "prod", "priority": 100, "guarantee": {"gpus": 4}},
            {"name": "dev", "priority": 30, "guarantee": {"gpus": dev_guarantee}, "limit": {"gpus": 6}},
            {"name": "poc", "priority": 10, "limit": {"gpus": 2}}]})
    insts = full(prod_holds)
    snap = cluster([worker("h", 256, [gpu(i, 24) for i in range(8)])], insts)
    queue = [Waiting(f"prod-m-{k}", "prod-m", 100, 0, float(k), "prod") for k in range(4, 8)]
    quotas = Quotas({t.name: t for t in tf.tenants}, by_tenant(snap.instances, OWNERS.tenant_of))
    specs = {"prod-m": (spec("prod-m").model_copy(update={"run_command": "serve {port}"}), REQ)}  # slivers not offered
    w = to_wake(snap, queue, specs, quotas=quotas)
    assert w.woken == [] and w.reclaim == [f"prod-m-{k}" for k in range(4, 4 + woken)]
    assert all(r.startswith("unschedulable") for r in w.held.values()) and len(w.held) == 4 - woken


def test_no_borrower_no_reclaim_wake():
    # everyone else within a guarantee: preemption cannot help, so nothing is woken for it
    tf = TenantsFile.model_validate({"tenants": [
        {"name": "prod", "priority": 100, "guarantee": {"gpus": 4}},
        {"name": "dev", "guarantee": {"gpus": 6}}, {"name": "poc", "guarantee": {"gpus": 2}}]})
    snap = cluster([worker("h", 256, [gpu(i, 24) for i in range(8)])], full(0))
    quotas = Quotas({t.name: t for t in tf.tenants}, by_tenant(snap.instances, OWNERS.tenant_of))
    specs = {"prod-m": (spec("prod-m").model_copy(update={"run_command": "serve {port}"}), REQ)}
    w = to_wake(snap, [Waiting("prod-m-0", "prod-m", 100, 0, 0.0, "prod")], specs, quotas=quotas)
    assert w.reclaim == [] and "prod-m-0" in w.held
