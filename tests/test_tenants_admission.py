"""Admission and preemption as the decide activity runs them (scheduler/tenancy/admit.py), and
the ledger's side on SQLite and PostgreSQL: limits enforced under the ledger's locks (also by
threads booking at once), and a preemption moving the victims' GPUs in one transaction."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from contracts.control import InstanceRecord, PlacementPlan
from store import ledger, records, tenants
from scheduler.request import FlatRequest
from scheduler.tenancy.admit import admit
from scheduler.tenancy.config import TenantsFile
from scheduler.tenancy.preemption import Owners
from scheduler.units import GiB
from tests.conftest import cluster, gpu, worker
from tests.test_ledger import host
from tests.test_tenancy_policy import TENANTS, held, spec

REQ = FlatRequest(vram=20 * GiB)
OWNERS = Owners({"prod-m": "prod", "dev-m": "dev", "poc-m": "poc"}, {}, {})


def two_gpus(*held_):
    return cluster([worker("w", 64, [gpu(0, 24), gpu(1, 24)])], list(held_))


@pytest.mark.parametrize("held_, model, name, placed, quota, victims", [
    # poc (limit 2) holds 1 GPU; one free GPU: 1 + 1 = 2 <= 2, placed
    ([held("poc-m-0", "poc-m", "w", 0)], "poc-m", "poc-m-1", True, None, []),
    # poc holds 2 of its 2: a free GPU is not enough, the quota leads
    ([held("poc-m-0", "poc-m", "w", 0), held("poc-m-1", "poc-m", "w", 1)], "poc-m", "poc-m-2", False,
     "quota: tenant poc uses 2 of its 2 GPUs (this replica needs 1)", []),
    # the replica itself holds GPU 1 (re-deciding at booking): 1 (poc-m-0) + 1 = 2, not 3
    ([held("poc-m-0", "poc-m", "w", 0), held("poc-m-1", "poc-m", "w", 1)], "poc-m", "poc-m-1", True, None, []),
    # prod (guarantee 4, uses 0) on a full cluster of dev: takes the newest dev replica (dev-m-1, started at 2)
    ([held("dev-m-0", "dev-m", "w", 0), held("dev-m-1", "dev-m", "w", 1)], "prod-m", "prod-m-0", True, None,
     ["dev-m-1"]),
    # dev (no guarantee) on a cluster full of poc: no preemption across tenants
    ([held("poc-m-0", "poc-m", "w", 0), held("poc-m-1", "poc-m", "w", 1)], "dev-m", "dev-m-0", False, None, []),
])
def test_admit(held_, model, name, placed, quota, victims):
    owners = Owners(OWNERS.tenant_of, {}, {"dev-m-0": 1.0, "dev-m-1": 2.0})
    a = admit(two_gpus(*held_), spec(model), REQ, TENANTS, owners, name)
    assert (a.decision.scheduled and a.quota is None, a.quota, a.victims) == (placed, quota, victims)


def test_a_full_tenant_gets_the_quota_even_when_nothing_fits():
    # the cluster is full (poc 2, dev... none free) and poc is at its limit: the quota leads, not the capacity
    a = admit(two_gpus(held("poc-m-0", "poc-m", "w", 0), held("poc-m-1", "poc-m", "w", 1)), spec("poc-m"), REQ,
              TENANTS, OWNERS, "poc-m-9")
    assert not a.decision.scheduled and a.quota.startswith("quota: tenant poc uses 2 of its 2 GPUs")


def test_preemption_that_does_not_help_is_not_tried_and_says_why():
    # 30 GiB never fits the one 24 GiB GPU: prod may reclaim, but no victim set helps
    one = cluster([worker("w", 64, [gpu(0, 24)])], [held("dev-m-0", "dev-m", "w", 0)])
    a = admit(one, spec("prod-m", 30), FlatRequest(vram=30 * GiB),
              TENANTS, OWNERS, "prod-m-0")
    assert a.victims == [] and not a.decision.scheduled
    assert a.notes == ["preemption: it does not fit even on an empty cluster"]


def test_no_preemption_of_equal_or_higher_priority_and_no_cycle():
    # within dev: b (priority 5) may not take a-0 (priority 5); c (6) may; then a (5) cannot take it back
    full = two_gpus(held("a-0", "a", "w", 0), held("x-0", "x", "w", 1))
    owners = Owners({"a": "dev", "b": "dev", "c": "dev", "x": "prod"}, {"a": 5, "b": 5, "c": 6}, {})
    assert admit(full, spec("b"), REQ, TENANTS, owners, "b-0").victims == []
    assert admit(full, spec("c"), REQ, TENANTS, owners, "c-0").victims == ["a-0"]
    after = two_gpus(held("c-0", "c", "w", 0), held("x-0", "x", "w", 1))
    assert admit(after, spec("a"), REQ, TENANTS, owners, "a-0").victims == []
    # prod (priority 100) is never a victim of dev: x-0 stays whatever dev's deployment priority
    assert "x-0" not in admit(after, spec("a"), REQ, TENANTS, Owners(owners.tenant_of, {"a": 10**6}, {}), "a-0").victims


# --- the ledger ---------------------------------------------------------------------------------

def plan(worker_: str, g: int) -> PlacementPlan:
    return PlacementPlan(worker=worker_, gpu_indexes=[g], claim={"vram": {g: 20 * GiB}, "ram": GiB})


def setup(engine, gpus: int = 4):
    records.upsert_worker(engine, host("h", gpus=gpus))
    tenants.apply(engine, TenantsFile.model_validate({"tenants": [
        {"name": "prod", "priority": 100, "guarantee": {"gpus": 2}},
        {"name": "poc", "priority": 10, "limit": {"gpus": 2}}]}))
    for dep, tenant in (("prod-m", "prod"), ("poc-m", "poc")):
        records.save_deployment(engine, dep, {"name": dep, "tenant": tenant}, 4, "active")
        for i in range(4):
            records.create_instance(engine, InstanceRecord(name=f"{dep}-{i}", deployment=dep, model=dep, state="pending"))


def test_reserve_enforces_the_limit_from_the_ledger(store):
    _, _, engine = store
    setup(engine)
    ledger.reserve(engine, "poc-m-0", plan("h", 0))
    ledger.reserve(engine, "poc-m-1", plan("h", 1))
    with pytest.raises(ledger.OverQuota, match="quota: tenant poc uses 2 of its 2 GPUs"):
        ledger.reserve(engine, "poc-m-2", plan("h", 2))  # 2 + 1 > 2
    assert ledger.reserve(engine, "poc-m-1", plan("h", 1))[1] is False  # its own booking again: not counted twice
    assert tenants.usage(engine)["poc"].gpus == 2


def test_concurrent_bookings_never_pass_a_limit(store):
    # 4 threads book 4 poc replicas at once, each on its own host (no worker lock in common: only
    # the tenant's lock serializes them): the limit (2) holds, 2 are refused
    _, _, engine = store
    setup(engine)
    for i in range(4):
        records.upsert_worker(engine, host(f"h{i}", gpus=1))

    def book(i):
        try:
            ledger.reserve(engine, f"poc-m-{i}", plan(f"h{i}", 0))
            return "booked"
        except ledger.OverQuota:
            return "quota"

    with ThreadPoolExecutor(4) as ex:
        got = sorted(ex.map(book, range(4)))
    assert got == ["booked", "booked", "quota", "quota"] and tenants.usage(engine)["poc"].gpus == 2


def test_preempt_moves_the_gpus_in_one_transaction(store):
    _, _, engine = store
    setup(engine, gpus=2)
    ledger.reserve(engine, "poc-m-0", plan("h", 0))
    ledger.reserve(engine, "poc-m-1", plan("h", 1))
    with pytest.raises(ledger.StaleDecision, match="does not fit"):  # without victims it does not fit
        ledger.preempt(engine, "prod-m-0", plan("h", 1), {}, "x")
    with pytest.raises(ledger.StaleDecision, match="victim poc-m-0 no longer holds"):  # the plan assumed GPU 1
        ledger.preempt(engine, "prod-m-0", plan("h", 0), {"poc-m-0": plan("h", 1)}, "x")
    why = "preempted by prod/prod-m-0 to reclaim prod's guarantee"
    assert ledger.preempt(engine, "prod-m-0", plan("h", 1), {"poc-m-1": plan("h", 1)}, why) == (plan("h", 1), True)
    assert ledger.preempt(engine, "prod-m-0", plan("h", 1), {"poc-m-1": plan("h", 1)}, why)[1] is False  # a retry
    assert ledger.booked_per_gpu(engine) == {("h", 0): 20 * GiB, ("h", 1): 20 * GiB} and ledger.overbooked(engine) == []
    assert ledger.workers_of(engine, "poc-m-1") == [] and ledger.workers_of(engine, "prod-m-0") == ["h"]
    victim = next(i for i in records.instances_of(engine, "poc-m") if i.name == "poc-m-1")
    assert victim.reason == why
    # on a host (SCHEDULED) without a placement: its process may still run; poc-m-0 holds its placement
    assert records.preempted_running(engine, ["poc-m-1", "poc-m-0"]) == ["poc-m-1"]
    records.record_instance(engine, InstanceRecord(name="poc-m-1", deployment="poc-m", model="poc-m", state="pending",
                                                   reason=why))
    assert records.preempted_running(engine, ["poc-m-1"]) == []  # PENDING: its workflow stopped it


def test_explain_shows_the_quota_first_and_the_victims():
    from views.render.explain import explain

    quota = "quota: tenant poc uses 2 of its 2 GPUs (this replica needs 1)"
    out = explain({"instance": "poc-m-2", "state": "pending", "scheduled": False, "reasons": [quota, "other"],
                   "decision": {"decisive": 1, "quota": quota}})
    assert out.splitlines()[3:] == [f"  - {quota}"]  # the one decisive reason: the quota
    out = explain({"instance": "prod-m-0", "state": "running", "scheduled": True, "strategy": "single_gpu",
                   "worker": "h", "gpu_indexes": [1], "decision": {"placement": {"worker": "h", "gpu_indexes": [1]},
                                                                    "victims": ["poc-m-1", "dev-m-5"],
                                                                    "preempt_why": "to reclaim prod's guarantee"}})
    assert "preempted poc-m-1, dev-m-5 to reclaim prod's guarantee" in out.splitlines()


def test_preempt_checks_guarantees_again_under_the_tenants_locks(store):
    # 4 GPUs: prod (guarantee 2) holds 2, poc holds 2. A third prod replica would take prod to 3 > 2:
    # two workers deciding at once (prod at 1 on both snapshots) must not both reclaim
    _, _, engine = store
    setup(engine)
    for i, n in enumerate(("prod-m-0", "prod-m-1", "poc-m-0", "poc-m-1")):
        ledger.reserve(engine, n, plan("h", i))
    with pytest.raises(ledger.StaleDecision, match="tenant prod would pass its guarantee"):
        ledger.preempt(engine, "prod-m-2", plan("h", 3), {"poc-m-1": plan("h", 3)}, "x")
    # a victim tenant back within its guarantee (poc: guarantee 2, holds 2) is not preempted
    ledger.release(engine, "prod-m-1")
    tenants.apply(engine, TenantsFile.model_validate({"tenants": [
        {"name": "prod", "priority": 100, "guarantee": {"gpus": 2}},
        {"name": "poc", "priority": 10, "guarantee": {"gpus": 2}, "limit": {"gpus": 2}}]}))
    with pytest.raises(ledger.StaleDecision, match="tenant poc no longer borrows"):
        ledger.preempt(engine, "prod-m-2", plan("h", 3), {"poc-m-1": plan("h", 3)}, "x")
    assert ledger.workers_of(engine, "poc-m-1") == ["h"]  # nothing written
