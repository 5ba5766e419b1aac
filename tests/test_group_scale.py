"""A group's scale-out and scale-in (scheduler/groups/scale_out.py, scale_in.py) and the scorers
they add (scheduler/scorers/proximity.py, pairing.py, retention.py), unit by unit. The parity with
GPUStack 2.3.0 is tests/test_group_parity_scale.py."""

import pytest

from scheduler.cluster import GPU, InstanceState, Subordinate
from scheduler.decide import decide
from scheduler.decision import Candidate, claim
from scheduler import filters
from scheduler.groups import domains
from scheduler.groups.layers import RACK_LAYER
from scheduler.groups.scale_in import scale_in
from scheduler.groups.scale_out import scale_out
from scheduler.groups.roles import role_spec
from scheduler.groups.spec import RoleName
from scheduler.request import FlatRequest
from scheduler.scorers import pairing, proximity, retention
from scheduler.spec import ModelSpec
from scheduler.units import GiB
from tests.conftest import cluster, gpu, inst, worker

ZONE, RACK = "topology.gpustack.ai/zone", "topology.gpustack.ai/rack"
REQ = FlatRequest(vram=10 * GiB, ram=GiB)


def group(prefill=1, decode=1, router=False, **kw):
    roles = [{"name": "prefill", "replicas": prefill}, {"name": "decode", "replicas": decode}]
    base = dict(name="g", source={"huggingface": {"repo": "org/m"}}, backend="custom", run_command="x {port}",
                roles=roles + ([{"name": "router"}] if router else []), disaggregation={"mode": "custom"})
    base.update(kw)
    return ModelSpec(**base)


def host(name, zone=None, rack=None, gpus=2, **kw):
    labels = {k: v for k, v in ((ZONE, zone), (RACK, rack)) if v}
    return worker(name, 64, [gpu(i, 24) for i in range(gpus)], labels=labels, **kw)


def member(name, role, worker_, gpu_=0, state=InstanceState.RUNNING, **kw):
    return inst(name, "g", worker_, [gpu_], {gpu_: 10 * GiB}, role=role, group="g", state=state, **kw)


# ---- proximity: the narrowing ----

def test_narrow_keeps_the_tightest_inside():
    # zone z1 racks r1 (a, b) and r2 (c). Spans: a+b share rack (2), a+c share zone (1), a alone is
    # the host (3). Only the one-worker candidate stays; a list already all tight comes back as is.
    snap = cluster([host("a", "z1", "r1"), host("b", "z1", "r1"), host("c", "z1", "r2")])
    where = domains.paths(snap.workers, domains.active_layers(snap))

    def cand(*ws):
        return Candidate(ws[0], [0], claim(), [Subordinate(worker=w, gpu_indexes=[0]) for w in ws[1:]])
    ab, ac, a = cand("a", "b"), cand("a", "c"), cand("a")
    assert proximity.narrow([ab, ac, a], where, 3) == [a]
    assert proximity.narrow([ac, ab], where, 3) == [ab]
    same = [cand("a"), cand("b")]
    assert proximity.narrow(same, where, 3) is same


# ---- pairing: the counts, a member's share, the weight ----

def test_opposite_counts_count_every_worker_a_member_holds():
    # d1 spans a and b (a subordinate on b): both count it once; d2 on a; p1 is prefill (not
    # counted for a prefill); x is another group's decode; d3 is stopping (counted only with leaving)
    insts = [member("d1", "decode", "a", subordinates=[{"worker": "b", "gpu_indexes": [0]}]),
             member("d2", "decode", "a", 1), member("p1", "prefill", "c"),
             inst("x", "h", "c", [1], role="decode", group="h"),
             member("d3", "decode", "c", 1, state=InstanceState.STOPPING)]
    assert pairing.opposite_counts(insts, "g", RoleName.PREFILL) == {"a": 2, "b": 1, "c": 1}
    assert pairing.opposite_counts(insts, "g", RoleName.PREFILL, leaving=False) == {"a": 2, "b": 1}
    assert pairing.opposite_counts(insts, "g", RoleName.DECODE) == {"c": 1}
    assert pairing.opposite_counts(insts, "g", RoleName.ROUTER) == {}  # the router has no opposite
    # a member with two parts on one worker is one partner there (GPUStack's member_worker_ids)
    twice = [member("d1", "decode", "a", subordinates=[{"worker": "a", "gpu_indexes": [1]}])]
    assert pairing.opposite_counts(twice, "g", RoleName.PREFILL) == {"a": 1}


@pytest.mark.parametrize("workers,share", [
    (["a"], 2.0), (["a", "b"], 1.5),  # its own width divides: (2 + 1) / 2
    (["c"], 0.0), ([], 0.0),
])
def test_share(workers, share):
    assert pairing.share(workers, {"a": 2, "b": 1}) == share


@pytest.mark.parametrize("ceilings,floor,w", [
    (105, 200, 200),  # placement 100 + locality 5: the floor holds
    (255, 200, 256),  # + proximity 150 (host only): one above
    (555, 200, 556),  # + proximity 450 (zone, rack, host)
    (555, 1000, 1000),  # a raised floor raises it
    (555, 0, 0),  # 0 is off and stays off
])
def test_weight(ceilings, floor, w):
    assert pairing.weight(ceilings, floor) == w


def test_retention_scores_are_share_over_peak():
    # decodes: a 2, b 1. Prefills on a (2/2 -> 100), b (1/2 -> 50), c (0), a+b (1.5/2 -> 75)
    ms = [member("p1", "prefill", "a"), member("p2", "prefill", "b"), member("p3", "prefill", "c"),
          member("p4", "prefill", "a", subordinates=[{"worker": "b", "gpu_indexes": [1]}])]
    assert retention.scores(ms, {"a": 2, "b": 1}) == [100.0, 50.0, 0.0, 75.0]
    assert retention.scores(ms, {}) == [0.0] * 4


# ---- scale_out ----

def test_with_no_member_placed_it_decides_as_decide_does():
    # nothing of the group placed: no proximity, no pairing; the decision is decide(role_spec)'s
    snap = cluster([host("a", "z1"), host("b", "z2")], [inst("o", "other", "a", [0], {0: 5 * GiB})])
    for role in (RoleName.PREFILL, RoleName.DECODE):
        chain = filters.member_chain(group(), role, "g")
        d, plain = scale_out(snap, group(), role, REQ, "g"), decide(snap, role_spec(group(), role), REQ, chain=chain)
        assert d.placement.to_dict() == plain.placement.to_dict()
        assert [c.to_dict() for c in d.candidates] == [c.to_dict() for c in plain.candidates]
        assert d.reasons == plain.reasons


def test_a_member_of_another_group_is_not_a_partner():
    # h's decode on b is not g's: a new g prefill gets no pairing and spreads to the emptier host
    snap = cluster([host("a"), host("b")], [member("p1", "prefill", "a"),
                                           inst("hd", "h", "b", [0], {0: 10 * GiB}, role="decode", group="h")])
    d = scale_out(snap, group(), RoleName.PREFILL, REQ, "g")
    assert "pairing" not in d.placement.scores


def test_the_router_gets_proximity_and_no_pairing():
    # decode on b (rack r1), prefill on c (rack r2), router candidates a (r1), d (z2): a shares zone
    # and rack with b (300), d nothing. The router books RAM only.
    snap = cluster([host("a", "z1", "r1"), host("b", "z1", "r1"), host("c", "z1", "r2"), host("d", "z2", "r3")],
                   [member("d1", "decode", "b"), member("p1", "prefill", "c")])
    d = scale_out(snap, group(router=True), RoleName.ROUTER, FlatRequest(vram=0, ram=2 * GiB), "g")
    by = {c.worker: c.scores for c in d.candidates}
    assert all("pairing" not in s for s in by.values())
    assert {w: s["proximity"] for w, s in by.items()} == pytest.approx({"a": 300.0, "b": 450.0, "c": 450.0, "d": 0.0})


def test_must_gather_floor_refuses_outside_and_says_why():
    # MustGather rack: members in r1 (a, b full); c is in r2. Nothing inside r1 fits: not placed,
    # and the floor's reasons lead
    full = [member(f"p{i}", "prefill", "a", i) for i in (0, 1)] + [member(f"d{i}", "decode", "b", i) for i in (0, 1)]
    for m in full:
        m.claim.vram[m.gpu_indexes[0]] = 24 * GiB
    snap = cluster([host("a", "z1", "r1"), host("b", "z1", "r1"), host("c", "z1", "r2")], full)
    spec = group(2, 2, gather={"strategy": "MustGather", "layer": RACK_LAYER})
    d = scale_out(snap, spec, RoleName.PREFILL, REQ, "g")
    assert not d.scheduled
    assert any("outside rack z1 / r1" in r and "worker c" in r for r in d.reasons)


@pytest.mark.parametrize("members,kept", [
    ([], ["a", "b", "c", "u"]),  # nothing placed: no floor
    ([member("d1", "decode", "a")], ["a", "b"]),  # the one rack the members are in
    ([member("d1", "decode", "a"), member("p1", "prefill", "c")], ["a", "b", "c", "u"]),  # two racks: broken, no floor
    ([member("d1", "decode", "u")], ["a", "b", "c", "u"]),  # members unclassified at rack: no floor
])
def test_the_floor_only_binds_one_domain(members, kept):
    snap = cluster([host("a", "z1", "r1"), host("b", "z1", "r1"), host("c", "z1", "r2"), host("u", "z1")], members)
    d = scale_out(snap, group(gather={"strategy": "MustGather", "layer": RACK_LAYER}), RoleName.PREFILL, REQ, "g")
    assert sorted({c.worker for c in d.candidates}) == kept


# ---- scale_in ----

def test_scale_in_leaves_out_stopping_members_and_their_pairs():
    # p1 is stopping: not a candidate. d on c is stopping: not a partner for p3 on c.
    snap = cluster([host("a"), host("b"), host("c")],
                   [member("p1", "prefill", "a", state=InstanceState.STOPPING), member("p2", "prefill", "b"),
                    member("p3", "prefill", "c"), member("d1", "decode", "b", 1),
                    member("d2", "decode", "c", 1, state=InstanceState.STOPPING)])
    ch = scale_in(snap, group(3, 2), RoleName.PREFILL, "g")
    assert [m.instance.name for m in ch.members] == ["p3", "p2"] and ch.victim == "p3"
    assert "left out, already stopping: p1" in ch.reasons


def test_scale_in_of_a_role_with_no_member():
    ch = scale_in(cluster([host("a")], [member("d1", "decode", "a")]), group(), RoleName.PREFILL, "g")
    assert ch.victim is None and ch.members == [] and ch.reasons == ["no prefill member to remove"]


def test_scale_in_choice_to_dict():
    snap = cluster([host("a"), host("b")], [member("p1", "prefill", "a"), member("p2", "prefill", "b"),
                                            member("d1", "decode", "b", 1)])
    d = scale_in(snap, group(2), RoleName.PREFILL, "g").to_dict()
    assert d["victim"] == "p1" and [m["name"] for m in d["members"]] == ["p1", "p2"]
    assert d["members"][1]["scores"]["retention"] == 20.0 and "1 decode(s) beside it" in d["members"][1]["why"]


# ---- where gpuflow differs (docs/gpustack-differences.md) ----

def test_pairing_weight_counts_gpuflows_own_scorers_on_the_chain():
    # a GPU reporting its NUMA node puts the interconnect scorer (10) on the chain, which GPUStack
    # does not have: W = max(200, 100 + 5 + 10 + 150 + 1) = 266 (GPUStack: 256)
    def numa_host(name):
        return worker(name, 64, [GPU(index=0, vendor="nvidia", type="cuda", vram_total=24 * GiB, numa_node=0)])
    d = scale_out(cluster([numa_host("a"), numa_host("b")], [member("d1", "decode", "a", 0)]), group(), "prefill", REQ, "g")
    assert next(c for c in d.candidates if c.worker == "a").scores["pairing"] == 266.0


def test_scale_in_placement_counts_the_other_instances_on_a_worker():
    # p1 and p2 tie on status and retention (no decode beside either). Placement in removal mode
    # counts the other deployment's instance on a as ``oth``: p1 = (0.85 * (0.45 + 0.35 * 0 + 0.20
    # * 0) + 0.15 * 1/(1 + 1 + 0.2)) * 1 = 0.4507, p2 = (0.85 * 0.65 + 0.15 * 0.5) * 1 = 0.6275, so
    # p1 goes though it is second in order. GPUStack counts only the role's members: a tie, p2 goes.
    snap = cluster([host("a"), host("b"), host("c")],
                   [member("p2", "prefill", "b"), member("p1", "prefill", "a"), member("d1", "decode", "c"),
                    inst("o", "other", "a", [0], {0: 5 * GiB})])
    ch = scale_in(snap, group(2), RoleName.PREFILL, "g")
    assert ch.victim == "p1"
    assert {x.instance.name: round(x.scores["placement"], 4) for x in ch.members} == {"p1": 0.4507, "p2": 0.6275}
