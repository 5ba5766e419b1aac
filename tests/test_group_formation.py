"""Formation's parts as tables: dealing members (groups/deal.py), domains and the floor
(groups/domains.py), the PD-mode and gather-floor filters, and form()'s whole-or-nothing answer."""

import pytest

from scheduler import filters, occupancy
from scheduler.decide import decide
from scheduler.decision import Context
from scheduler.filters import gather_floor, pd_mode
from scheduler.groups import deal, domains
from scheduler.groups.form import form
from scheduler.groups.layers import RACK_LAYER, ZONE_LAYER
from scheduler.groups.spec import RoleName
from scheduler.request import FlatRequest
from scheduler.units import GiB
from tests.conftest import cluster, gpu, inst, worker
from tests.test_group_parity_formation import group, labelled, reqs

P, D, R = RoleName.PREFILL, RoleName.DECODE, RoleName.ROUTER
ORDER = {w: k for k, w in enumerate("abcd")}


@pytest.mark.parametrize("slots,replicas,load,warm,share", [
    ({"a": 2, "b": 2}, 3, {}, set(), [("a", 2), ("b", 1)]),  # one at a time: a, b, a
    ({"a": 1, "b": 3}, 3, {}, set(), [("b", 2), ("a", 1)]),  # roomiest first: b, a, then b (a is full)
    ({"a": 2, "b": 2}, 1, {"a": 1}, set(), [("b", 1)]),  # equal room: fewer of the group's members first
    ({"a": 2, "b": 2}, 1, {}, {"b"}, [("b", 1)]),  # then a worker holding the model's files
    ({"a": 2, "b": 2}, 5, {}, set(), None),  # 4 slots for 5 members
])
def test_share_out(slots, replicas, load, warm, share):
    assert deal.share_out(slots, replicas, load, warm, ORDER) == share


@pytest.mark.parametrize("sizes,slots,kept,held", [
    # 24 and 23 GiB are one size (23 >= 0.9 * 24), 48 another; band {a, b} holds 2, {c} 1: c zeroed
    ({"a": 24, "b": 23, "c": 48}, {"a": 1, "b": 1, "c": 1}, {"a": 1, "b": 1, "c": 0}, 2),
    # equal members (1 each): the bigger card wins
    ({"a": 24, "c": 48}, {"a": 1, "c": 1}, {"a": 0, "c": 1}, 1),
    ({"a": 24, "b": 24}, {"a": 1, "b": 1}, {"a": 1, "b": 1}, None),  # one size: nothing narrowed
])
def test_one_gpu_size_a_role(sizes, slots, kept, held):
    assert deal.one_size(slots, {w: s * GiB for w, s in sizes.items()}, ORDER) == (kept, held)


@pytest.mark.parametrize("spans,warm,terms", [
    # 2P2D, each host one pair: (1 + 1) / (2 * 2)
    ([(P, ["a"]), (P, ["b"]), (D, ["a"]), (D, ["b"])], set(), {"pair": 0.5}),
    # a prefill over a and b, its decode on b: half its KV local; b warm: (1/2 + 1) / 2 members
    ([(P, ["a", "b"]), (D, ["b"])], {"b"}, {"pair": 0.5, "file": 0.75}),
])
def test_group_terms(spans, warm, terms):
    assert deal.terms(deal.Placed(spans), warm) == terms


def zones():
    # z1: rack r1 = a, b; z2: rack r1 = c (another rack of the same name); d: no label
    return cluster([labelled("a", [24], "z1", "r1"), labelled("b", [24], "z1", "r1"),
                    labelled("c", [24], "z2", "r1"), labelled("d", [24])])


def test_a_layers_domains_are_addressed_from_the_root():
    snap = zones()
    got = {x.id: [(d.address, d.workers) for d in ds] for x, ds in domains.scopes(snap.workers, domains.active_layers(snap))}
    assert got[RACK_LAYER] == [(["z1", "r1"], ("a", "b")), (["z2", "r1"], ("c",))]  # d is in no rack
    assert got[ZONE_LAYER] == [(["z1"], ("a", "b")), (["z2"], ("c",))]


@pytest.mark.parametrize("names,depth", [
    (["a"], 3), (["a", "b"], 2), (["a", "c"], 0), (["a", "d"], 0),  # zone, rack, host: a and b share the rack
])
def test_shared_depth(names, depth):
    snap = zones()
    assert domains.depth(domains.paths(snap.workers, domains.active_layers(snap)), names) == depth


def member(name, role, w, group="g"):
    return inst(name, "g", w, [0], {0: GiB}, role=role, group=group)


@pytest.mark.parametrize("strategy,members,floor", [
    ("MustGather", [("p", P, "a")], ("a", "b")),  # the prefill on a: rack z1 / r1
    ("MustGather", [("p", P, "a"), ("d", D, "c")], None),  # two racks (z1 / r1, z2 / r1): broken, not forced
    ("MustGather", [("p", P, "d")], None),  # d is in no rack: unknown, not forced
    ("MustGather", [("r", R, "a")], None),  # a router says nothing about where the group is
    ("PreferGather", [("p", P, "a")], None),  # a target, not a floor
])
def test_floor(strategy, members, floor):
    snap = zones().model_copy(update={"instances": [member(*m) for m in members]})
    f = domains.floor(snap, group(gather=(strategy, RACK_LAYER)), "g")
    assert (f.workers if f else None) == floor


def run(flt, snap, role_spec_=None):
    occ = occupancy.of(snap)
    spec = role_spec_ or group()
    ctx = Context(spec, snap, FlatRequest(vram=GiB), None, occ.allocatable, None, occ)
    return flt.run(ctx, list(snap.workers)) if flt.applies(ctx) else None


def test_gather_floor_filter_keeps_the_floor():
    snap = zones().model_copy(update={"instances": [member("p", P, "a")]})
    kept, v = run(gather_floor.Floor(group(gather=("MustGather", RACK_LAYER)), "g"), snap)
    assert [w.name for w in kept] == ["a", "b"] and v.note == "Kept 2/4 workers inside rack z1 / r1."
    assert v.removed["c"] == ["outside rack z1 / r1, where the group's prefill and decode members are "
                              "(gather MustGather at rack: refused rather than placed outside it)"]
    assert run(gather_floor.Floor(group(gather=("MustGather", RACK_LAYER)), "other"), snap) is None


@pytest.mark.parametrize("mode,vendor,role,out", [
    ("vllm-nixl", None, P, {"amd": "its GPUs' vendor (amd) is not nvidia, required by pd mode vllm-nixl",
                            "cpu": "its GPUs' vendor (none: no GPU) is not nvidia, required by pd mode vllm-nixl",
                            "nixl-only": None}),
    ("vllm-mooncake", None, P, {"amd": "its GPUs' vendor (amd) is not nvidia, required by pd mode vllm-mooncake",
                                "cpu": "its GPUs' vendor (none: no GPU) is not nvidia, required by pd mode vllm-mooncake",
                                "nixl-only": "its engines cannot run the mooncake KV connector pd mode vllm-mooncake "
                                             "needs (it reports: nixl)"}),
    ("vllm-mooncake", None, R, {"amd": "its GPUs' vendor (amd) is not nvidia, required by pd mode vllm-mooncake",
                                "cpu": "its GPUs' vendor (none: no GPU) is not nvidia, required by pd mode vllm-mooncake",
                                "nixl-only": None}),  # the router carries no KV
    ("custom", "amd", P, {"amd": None, "cpu": "its GPUs' vendor (none: no GPU) is not amd, required by "
                                              "disaggregation.vendor amd",
                          "nixl-only": "its GPUs' vendor (nvidia) is not amd, required by disaggregation.vendor amd"}),
    ("custom", None, P, None),  # nothing to check: the filter does not run
])
def test_pd_mode_filter(mode, vendor, role, out):
    snap = cluster([worker("amd", 64, [gpu(0, 24, "rocm", "amd")]), worker("cpu", 64),
                    worker("nixl-only", 64, [gpu(0, 24)], kv_connectors=["nixl"]), worker("n", 64, [gpu(0, 24)])])
    spec = group(backend="vllm" if mode != "custom" else "custom", mode=mode, vendor=vendor)
    got = run(pd_mode.Filter(spec, role), snap)
    if out is None:
        assert got is None
        return
    assert {w: (got[1].removed.get(w) or [None])[0] for w in out} == out


def test_a_plain_deployment_never_runs_the_group_filters():
    # the same mixed cluster: a plain vLLM spec's decision records only the ordinary filters
    snap = cluster([worker("amd", 64, [gpu(0, 24, "rocm", "amd")], kv_connectors=["nixl"]),
                    worker("n", 64, [gpu(0, 24)], cordoned=True)])
    plain = group(backend="vllm", mode="vllm-nixl").model_copy(update={"roles": None, "disaggregation": None})
    d = decide(snap, plain, FlatRequest(vram=10 * GiB))
    assert [v.name for v in d.filters] == ["cluster", "gpu_selector", "labels", "status", "cordon", "backend",
                                           "local_path"]  # command runs only for a custom command
    names = [f.name if hasattr(f, "name") else f.NAME for f in filters.member_chain(group(), P, "g")]
    assert names[-2:] == ["pd_mode", "gather_floor"]


def test_nothing_is_returned_when_a_role_does_not_fit():
    # a [24, 24]: decode (dealt first) and one prefill fit, the second prefill does not
    g = form(cluster([labelled("a", [24, 24])]), group(prefill=2), reqs())
    assert not g.scheduled and g.members == [] and g.role == P
    assert g.reasons[0] == "The group needs 3 placements and the cluster has room for 2: prefill does not fit."


def test_a_member_too_wide_for_one_host_spans_hosts():
    # vLLM with --tensor-parallel-size 2 on hosts of one 24 GiB GPU: no host holds a member alone;
    # the domain's workers together do (multi_worker: a main worker and one subordinate)
    ws = [labelled(n, [24], rack="r1") for n in "abcd"]
    g = form(cluster(ws), group(backend="vllm", mode="vllm-nixl", backend_parameters=["--tensor-parallel-size", "2"]),
             reqs(p=30, d=30))
    assert g.scheduled and sorted(w for m in g.members for w in m.workers) == ["a", "b", "c", "d"]


def test_every_role_needs_its_request():
    with pytest.raises(ValueError, match="no request for role decode"):
        form(zones(), group(), {P: FlatRequest(vram=GiB)})


def test_the_routers_nearness_is_the_deepest_layer_shared_with_a_member():
    # every pair's domains.depth, brute force, against the prefix sets the router's placement reads:
    # zones z1/z2, racks r1/r2 (r1 in both zones: two domains), hosts with no rack, one with no label
    from scheduler.groups.form import _Solve

    ws = [labelled("a", [24], zone="z1", rack="r1"), labelled("b", [24], zone="z1", rack="r1"),
          labelled("c", [24], zone="z1", rack="r2"), labelled("d", [24], zone="z2", rack="r1"),
          labelled("e", [24], zone="z1"), labelled("f", [24], zone="z2"), labelled("g", [24])]
    s = _Solve(cluster(ws), group(), reqs(), None)
    names = [w.name for w in ws]
    for hosts in (["a"], ["a", "d"], ["e"], ["g"], ["c", "f"], names):
        brute = [max((domains.depth(s.where, [w, h]) for h in hosts), default=0) for w in names]
        assert s._nearness(names, hosts) == brute, hosts
