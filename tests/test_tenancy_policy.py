"""Tenancy as pure policy, in tables: the tenants file's errors, limits, the brief's scenario
scaled down to 8 GPUs, minimal victim sets, no cycles, and the queue's order and wake-ups."""

from __future__ import annotations

import pytest

from scheduler.cluster import Claim, Instance
from scheduler.request import FlatRequest
from scheduler.spec import ModelSpec
from scheduler.tenancy.admission import borrowing, over_limit, within_guarantee
from scheduler.tenancy.config import TenantsFile
from scheduler.tenancy.preemption import Owners, plan
from scheduler.tenancy.queue import Waiting, to_wake
from scheduler.tenancy.usage import Usage, by_tenant
from scheduler.units import GiB
from tests.conftest import cluster, gpu, worker

TENANTS = TenantsFile.model_validate({"tenants": [
    {"name": "prod", "priority": 100, "guarantee": {"gpus": 4}},
    {"name": "dev", "priority": 30, "limit": {"gpus": 6}},
    {"name": "poc", "priority": 10, "limit": {"gpus": 2}}]})


def spec(name, gib=20):
    return ModelSpec.model_validate({"name": name, "backend": "custom", "run_command": "serve {port}",
                                     "source": {"local_path": "/m"}, "resources": {"vram": f"{gib} GiB", "ram": 0}})


def held(name, model, w, g, gib=20):
    return Instance(name=name, model=model, worker=w, gpu_indexes=[g], claim=Claim(vram={g: gib * GiB}))


@pytest.mark.parametrize("doc, error", [
    ({"tenants": [{"name": "a", "limit": {"gpus": -1}}]}, "greater than or equal to 0"),
    ({"tenants": [{"name": "a", "guarantee": {"gpus": 8}, "limit": {"gpus": 4}}]}, "guarantee gpus 8 is above its limit 4"),
    ({"tenants": [{"name": "a"}, {"name": "a"}]}, "repeated: a"),
    ({"tenants": [{"name": "Bad Name"}]}, "pattern"),
    ({"queueing": "LIFO"}, "BestEffortFIFO"),
])
def test_tenants_file_errors(doc, error):
    with pytest.raises(ValueError, match=error):
        TenantsFile.model_validate(doc)


def test_unknown_tenant_and_default():
    assert TENANTS.get("prdo") is None  # a typo is caught by the caller refusing the spec
    assert TENANTS.get(None).name == "default" and TENANTS.get("default").limit.gpus is None


@pytest.mark.parametrize("tenant, used, need, reason", [
    ("poc", Usage(gpus=2), Usage(gpus=1), "quota: tenant poc uses 2 of its 2 GPUs (this replica needs 1)"),
    ("poc", Usage(gpus=1), Usage(gpus=1), None),  # 1 + 1 = 2 <= 2
    ("prod", Usage(gpus=100), Usage(gpus=1), None),  # no limit
])
def test_limits(tenant, used, need, reason):
    assert over_limit(TENANTS.get(tenant), used, need) == reason


def test_guarantee_and_borrowing():
    prod, dev = TENANTS.get("prod"), TENANTS.get("dev")
    assert within_guarantee(prod, Usage(gpus=3), Usage(gpus=1))  # 3 + 1 <= 4
    assert not within_guarantee(prod, Usage(gpus=4), Usage(gpus=1))  # 5 > 4
    assert not within_guarantee(dev, Usage(), Usage(gpus=1))  # dev has no guarantee
    assert borrowing(dev, Usage(gpus=1)) and not borrowing(prod, Usage(gpus=4, ram=GiB))  # ram is not guaranteed: not counted


def _fill(snap, owners, model, tenant, n, start):
    """Admit up to n replicas of ``model`` one at a time, as the control plane would; returns the
    snapshot and how many were admitted."""
    got = 0
    for i in range(n):
        name = f"{model}-{i}"
        p = plan(snap, spec(model), FlatRequest(vram=20 * GiB), TENANTS, owners, name)
        used = by_tenant(snap.instances, owners.tenant_of).get(tenant, Usage())
        if p.placement is None or over_limit(TENANTS.get(tenant), used, Usage(gpus=1)):
            continue
        gone = set(p.victims)
        insts = [x for x in snap.instances if x.name not in gone] + [held(name, model, p.placement.worker, p.placement.gpu_indexes[0])]
        snap = snap.model_copy(update={"instances": insts})
        owners.started_at[name] = start + i
        got += 1
    return snap, got


def test_the_briefs_scenario_on_eight_gpus():
    # 4 workers x 2 GPUs x 24 GiB; every replica holds one GPU (20 GiB)
    snap = cluster([worker(f"w{i}", 64, [gpu(0, 24), gpu(1, 24)]) for i in range(4)])
    owners = Owners(tenant_of={"poc-m": "poc", "dev-m": "dev", "prod-m": "prod"},
                    priority_of={}, started_at={})
    snap, got = _fill(snap, owners, "poc-m", "poc", 4, start=0)
    assert got == 2  # poc (limit 2) asks for 4, gets 2
    snap, got = _fill(snap, owners, "dev-m", "dev", 8, start=100)
    assert got == 6  # dev (limit 6) asks for 8, gets 6: the cluster is full (2 + 6 = 8)
    # prod (guarantee 4) asks for 4: it reclaims, taking poc's two first (borrowing, priority 10),
    # then dev's two newest (dev-m-5, dev-m-4)
    victims = []
    for i in range(4):
        name = f"prod-m-{i}"
        p = plan(snap, spec("prod-m"), FlatRequest(vram=20 * GiB), TENANTS, owners, name)
        assert p.placement is not None and len(p.victims) == 1 and p.why == "to reclaim prod's guarantee"
        victims += p.victims
        snap = snap.model_copy(update={"instances": [x for x in snap.instances if x.name not in p.victims]
                                       + [held(name, "prod-m", p.placement.worker, p.placement.gpu_indexes[0])]})
    assert victims == ["poc-m-1", "poc-m-0", "dev-m-5", "dev-m-4"]
    # prod scaled to 6: 4 + 1 = 5 > its guarantee of 4, so only idle capacity: none, nothing preempted
    p = plan(snap, spec("prod-m"), FlatRequest(vram=20 * GiB), TENANTS, owners, "prod-m-4")
    assert p.placement is None and p.victims == []


def test_minimal_victim_set_by_fill_back():
    # one 24 GiB GPU holding a (10 GiB, oldest), b (8 GiB), c (4 GiB, newest): 2 GiB free.
    # The preemptor needs 10 GiB. Greedy, newest first: c (6 free, no), b (14 free, fits).
    # Fill back in reverse: b back -> 6 free, no, b stays a victim; c back -> 14 - 4 = 10, fits: c is spared.
    snap = cluster([worker("w", 64, [gpu(0, 24)])],
                   [held("a", "dev-m", "w", 0, 10), held("b", "dev-m", "w", 0, 8), held("c", "dev-m", "w", 0, 4)])
    owners = Owners({"dev-m": "dev", "prod-m": "prod"}, {}, {"a": 1, "b": 2, "c": 3})
    p = plan(snap, spec("prod-m", 10), FlatRequest(vram=10 * GiB), TENANTS, owners, "prod-m-0")
    assert p.victims == ["b"]


def test_no_preemption_that_would_not_help_or_of_higher_priority():
    snap = cluster([worker("w", 64, [gpu(0, 24)])], [held("x", "dev-m", "w", 0, 20)])
    # 30 GiB never fits a 24 GiB GPU: nobody is preempted
    owners = Owners({"dev-m": "dev", "prod-m": "prod"}, {}, {})
    p = plan(snap, spec("prod-m", 30), FlatRequest(vram=30 * GiB), TENANTS, owners, "prod-m-0")
    assert p.placement is None and p.victims == []
    # dev has no guarantee: a dev replica cannot take another tenant's GPU, even a lower-priority one
    owners = Owners({"poc-m": "poc", "dev-m": "dev"}, {}, {})
    snap2 = cluster([worker("w", 64, [gpu(0, 24)])], [held("y", "poc-m", "w", 0, 20)])
    assert plan(snap2, spec("dev-m"), FlatRequest(vram=20 * GiB), TENANTS, owners, "dev-m-0").victims == []
    # within one tenant: equal priority is not preempted, strictly higher is
    owners = Owners({"a": "dev", "b": "dev"}, {"a": 5, "b": 5}, {})
    snap3 = cluster([worker("w", 64, [gpu(0, 24)])], [held("a-0", "a", "w", 0, 20)])
    assert plan(snap3, spec("b"), FlatRequest(vram=20 * GiB), TENANTS, owners, "b-0").placement is None
    owners = Owners({"a": "dev", "b": "dev"}, {"a": 5, "b": 6}, {})
    p = plan(snap3, spec("b"), FlatRequest(vram=20 * GiB), TENANTS, owners, "b-0")
    assert p.victims == ["a-0"] and p.why == "for a higher-priority deployment of its tenant"


def test_no_cycles():
    # prod reclaims dev's GPU; then dev's victim, back in the queue, cannot take it back:
    # dev has no guarantee, and prod (within its guarantee) does not borrow
    owners = Owners({"dev-m": "dev", "prod-m": "prod"}, {}, {})
    snap = cluster([worker("w", 64, [gpu(0, 24)])], [held("d-0", "dev-m", "w", 0, 20)])
    p = plan(snap, spec("prod-m"), FlatRequest(vram=20 * GiB), TENANTS, owners, "prod-m-0")
    assert p.victims == ["d-0"]
    after = cluster([worker("w", 64, [gpu(0, 24)])], [held("prod-m-0", "prod-m", "w", 0, 20)])
    back = plan(after, spec("dev-m"), FlatRequest(vram=20 * GiB), TENANTS, owners, "d-0")
    assert back.placement is None and back.victims == []


def test_queue_order_and_heads_only():
    # one free 24 GiB GPU; three tenants wait. Order: prod (100) before dev (30) before poc (10),
    # then deployment priority, then arrival. Only the first that fits is woken; the rest wait.
    snap = cluster([worker("w", 64, [gpu(0, 24)])])
    specs = {m: (spec(m), FlatRequest(vram=20 * GiB)) for m in ("p", "d", "q")}
    queue = [Waiting("q-0", "q", 10, 0, 1.0), Waiting("d-0", "d", 30, 0, 3.0), Waiting("d-1", "d", 30, 1, 4.0),
             Waiting("p-0", "p", 100, 0, 5.0)]
    w = to_wake(snap, queue, specs)
    assert w.woken == ["p-0"] and set(w.held) == {"d-1", "d-0", "q-0"}


@pytest.mark.parametrize("big_used, small, held_back", [
    # a high-priority 30 GiB head fits only "big" (48 GiB) were it empty; a low-priority 20 GiB replica waits behind it
    (20, 16, True),   # big has 28 free, small 16: the replica would land on big, the head's worker: held back
    (30, 24, False),  # big has 18 free: the replica lands on small, which the head cannot use: woken
])
def test_best_effort_fifo_holds_back_only_what_competes(big_used, small, held_back):
    snap = cluster([worker("big", 64, [gpu(0, 48)]), worker("small", 64, [gpu(0, small)])],
                   [held("other", "z", "big", 0, big_used)])
    specs = {"h": (spec("h", 30), FlatRequest(vram=30 * GiB)), "l": (spec("l"), FlatRequest(vram=20 * GiB))}
    queue = [Waiting("h-0", "h", 50, 0, 1.0), Waiting("l-0", "l", 10, 0, 2.0)]
    w = to_wake(snap, queue, specs)
    assert w.woken == ([] if held_back else ["l-0"])
    if held_back:
        assert w.held["l-0"].startswith("held back for h-0")
    # StrictFIFO: nothing behind a head that does not fit
    w = to_wake(snap, queue, specs, strict=True)
    assert w.woken == [] and w.held["l-0"] == "StrictFIFO: behind h-0"
    # the same priority behind a blocked head is never held back
    same = [Waiting("h-0", "h", 10, 0, 1.0), Waiting("l-0", "l", 10, 0, 2.0)]
    assert to_wake(snap, same, specs).woken == ["l-0"]


def test_victims_spread_one_per_worker_come_from_one_worker():
    # 3 workers, one 24 GiB GPU each, holding an old dev replica and a newer poc replica of 10 GiB
    # (4 GiB free). The preemptor (prod, guarantee 4) needs 20 GiB: both replicas of one worker.
    # Victim order: poc before dev (lower tenant priority), newest first. Per worker the set is
    # {poc, dev}; the worker whose set comes earliest in that order wins: w2 (its poc is newest).
    ws = [worker(f"w{n}", 64, [gpu(0, 24)]) for n in range(3)]
    inst = [held(f"dev-m-{n}", "dev-m", f"w{n}", 0, 10) for n in range(3)] + \
           [held(f"poc-m-{n}", "poc-m", f"w{n}", 0, 10) for n in range(3)]
    started = {f"dev-m-{n}": n for n in range(3)} | {f"poc-m-{n}": 10 + n for n in range(3)}
    owners = Owners({"dev-m": "dev", "poc-m": "poc", "prod-m": "prod"}, {}, started)
    p = plan(cluster(ws, inst), spec("prod-m"), FlatRequest(vram=20 * GiB), TENANTS, owners, "prod-m-0")
    assert p.placement is not None and p.placement.worker == "w2"
    assert sorted(p.victims) == ["dev-m-2", "poc-m-2"]
