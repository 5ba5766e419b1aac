"""A group's store half (issue 41): its members' rows (store/groups.py) and its booking in one
ledger transaction, all or nothing (ledger.reserve_group); the deployment's rule for which spec
change replaces members (workflows/group_steps.py restarts_group; which way it rolls:
scheduler/groups/compat.py). Every host below has two 24 GiB GPUs; ``plan(worker, gpu, GiB)``
claims that much of one GPU."""

from __future__ import annotations

import pytest

from store import groups, ledger, records, tenants
from store.pending_queue import read
from store.snapshot import load_snapshot
from scheduler.tenancy.config import TenantsFile
from tests.store_fixtures import want
from tests.test_ledger import host, plan
from workflows.group_steps import restarts_group

B = ledger.Booking


def _setup(engine):
    records.upsert_worker(engine, host("h1"))
    records.save_deployment(engine, "pd", {"name": "pd", "tenant": "lab"}, 2)
    groups.create_members(engine, "pd", "pd", {"pd-0": "prefill", "pd-1": "decode"})


# (the members' plans, what reserve_group returns, the ledger's lines per GPU after)
CASES = [
    # 10 + 10 on GPU 0 and 20 on GPU 1: each fits (24 each) -> both booked
    ([plan("h1", 0, 10), plan("h1", 1, 20)], "booked", {("h1", 0): 10, ("h1", 1): 20}),
    # 20 on GPU 0, then 20 more on GPU 0: 40 > 24 -> the second does not fit, and the first is not kept
    ([plan("h1", 0, 20), plan("h1", 0, 20)], ledger.StaleDecision, {}),
    # the decode asks for a GPU h1 does not have (index 5): nothing of the group is booked
    ([plan("h1", 0, 10), plan("h1", 5, 10)], ledger.StaleDecision, {}),
]


@pytest.mark.parametrize("plans,result,after", CASES)
def test_a_group_is_booked_whole_or_not_at_all(sqlite_engine, plans, result, after):
    _setup(sqlite_engine)
    got = ledger.reserve_group(sqlite_engine, [B("pd-0", plans[0]), B("pd-1", plans[1])])
    if result == "booked":
        assert got == [(plans[0], True), (plans[1], True)]
    else:
        assert isinstance(got, result)
    assert {k: v // 2**30 for k, v in ledger.booked_per_gpu(sqlite_engine).items()} == after
    states = {i.name: i.state for i in records.instances_of(sqlite_engine, "pd")}
    assert states == ({"pd-0": "scheduled", "pd-1": "scheduled"} if after else {"pd-0": "pending", "pd-1": "pending"})


def test_a_member_not_wanted_books_nothing_of_the_group(sqlite_engine):
    _setup(sqlite_engine)
    got = ledger.reserve_group(sqlite_engine, [B("pd-0", plan("h1", 0, 10)), B("pd-9", plan("h1", 1, 10))])
    assert isinstance(got, ledger.NotWanted) and ledger.booked_per_gpu(sqlite_engine) == {}


def test_the_tenants_limit_counts_every_member(sqlite_engine):
    # lab may hold 1 GPU: the prefill's GPU fits the limit alone, the decode's second GPU does not -> neither
    _setup(sqlite_engine)
    tenants.apply(sqlite_engine, TenantsFile.model_validate({"tenants": [{"name": "lab", "limit": {"gpus": 1}}]}))
    got = ledger.reserve_group(sqlite_engine, [B("pd-0", plan("h1", 0, 10)), B("pd-1", plan("h1", 1, 10))])
    assert isinstance(got, ledger.OverQuota) and "lab" in str(got)
    assert ledger.booked_per_gpu(sqlite_engine) == {}


def test_members_carry_their_role_into_the_snapshot_and_stay_out_of_the_queue(sqlite_engine):
    _setup(sqlite_engine)
    want(sqlite_engine, "plain-0")
    assert groups.create_members(sqlite_engine, "pd", "pd", {"pd-0": "prefill"}) == []  # written already: kept
    assert groups.set_waiting(sqlite_engine, ["pd-0", "pd-1"], "unschedulable: role decode does not fit") == 2
    assert [q.instance for q in read(sqlite_engine).replicas] == ["plain-0"]  # the group waits on its deployment
    ledger.reserve_group(sqlite_engine, [B("pd-0", plan("h1", 0, 10)), B("pd-1", plan("h1", 1, 10))])
    snap = {i.name: (i.role and i.role.value, i.group) for i in load_snapshot(sqlite_engine).instances}
    assert snap["pd-0"] == ("prefill", "pd") and snap["pd-1"] == ("decode", "pd")


BASE = {"name": "pd", "backend": "custom", "roles": [{"name": "prefill", "replicas": 1}, {"name": "decode"}]}


@pytest.mark.parametrize("new,restarts", [
    ({**BASE, "roles": [{"name": "prefill", "replicas": 3}, {"name": "decode"}]}, False),  # a role's replicas
    ({**BASE, "replicas": 4}, False),  # the deployment's replicas mean nothing to a group
    ({**BASE, "backend_parameters": ["--x"]}, True),  # anything that runs: the whole group again
    ({**BASE, "roles": [{"name": "prefill", "replicas": 1, "env": {"A": "1"}}, {"name": "decode"}]}, True),
    ({**BASE, "roles": [{"name": "prefill", "replicas": 1}, {"name": "decode"}, {"name": "router"}]}, True),
])
def test_which_change_replaces_members(new, restarts):
    assert restarts_group(BASE, new) is restarts


def test_a_booked_member_placed_again_waits_in_the_queue_like_any_replica(sqlite_engine):
    # its host lost, its own workflow records it PENDING again: its booking named its backend
    _setup(sqlite_engine)
    ledger.reserve_group(sqlite_engine, [B("pd-0", plan("h1", 0, 10), backend="custom"),
                                         B("pd-1", plan("h1", 1, 10), backend="custom")])
    ledger.release(sqlite_engine, "pd-0")
    from contracts.control import InstanceRecord
    records.record_instance(sqlite_engine, InstanceRecord(name="pd-0", deployment="pd", model="pd", state="pending"))
    assert [q.instance for q in read(sqlite_engine).replicas] == ["pd-0"]
