"""Group formation where gpuflow follows GPUStack 2.3.0 (scheduler/group_solver.py
solve_group_placement, group_capacity.py, policies/worker_filters/pd_mode_filter.py). GPUStack's
behaviour is the expected value; deliberate differences are in docs/gpustack-differences.md.

Arithmetic used throughout: a custom member of 20 GiB books 20 GiB on one GPU, so a 24 GiB GPU holds
one (4 GiB left); a vLLM member books 90% of a GPU (21.6 of 24 GiB), one a GPU. Roles are dealt
hungriest first (GPUs a member), then by name: decode before prefill. A layer's domains are tried
smallest first, sized by the hungriest role's members with nothing placed (at most its replicas a
worker), ties by address; the first layer that holds the group wins."""

import pytest

from scheduler.groups.form import form
from scheduler.groups.layers import NODE_LAYER, RACK_LAYER, ZONE_LAYER, TopologyLayer
from scheduler.groups.spec import RoleName
from scheduler.request import FlatRequest
from scheduler.spec import ModelSpec
from scheduler.units import GiB
from tests.conftest import cluster, gpu, inst, worker

P, D, R = RoleName.PREFILL, RoleName.DECODE, RoleName.ROUTER
NVL = "custom-0000aa"  # a layer of the cluster's own, under rack: hosts on one NVLink fabric
NVL_LAYER = TopologyLayer(id=NVL, name="nvlink", label_keys=["example.com/nvl"], parent_layer=RACK_LAYER)


def group(prefill=1, decode=1, router=False, gather=None, backend="custom", mode="custom", vendor=None, **kw):
    roles = [{"name": "prefill", "replicas": prefill, **kw.pop("prefill_kw", {})}, {"name": "decode", "replicas": decode}]
    if router:
        roles.append({"name": "router", **({"resources": {"ram": router}} if router is not True else {})})
    base = dict(name="g", source={"huggingface": {"repo": "org/m"}}, backend=backend, roles=roles,
                disaggregation={"mode": mode, **({"vendor": vendor} if vendor else {})})
    if backend == "custom":
        base["run_command"] = "x {port}"
    if gather:
        base["gather"] = {"strategy": gather[0], "layer": gather[1]}
    base.update(kw)
    return ModelSpec(**base)


def reqs(p=20, d=20):
    return {P: FlatRequest(vram=int(p * GiB), ram=GiB), D: FlatRequest(vram=int(d * GiB), ram=GiB)}


def at(g, role):
    return [(m.worker, m.gpu_indexes) for m in g.members if m.role == role]


def labelled(name, gibs, zone=None, rack=None, nvl=None, ram=64):
    labels = {k: v for k, v in (("topology.gpustack.ai/zone", zone), ("topology.gpustack.ai/rack", rack),
                                ("example.com/nvl", nvl)) if v}
    return worker(name, ram, [gpu(i, g) for i, g in enumerate(gibs)], labels=labels)


# ---- formation in a fresh and in a partly full cluster ----

@pytest.mark.parametrize("workers,instances,domain,decode,prefill", [
    # a [24], b [24, 24]. Host layer, both sized 1 (decode, at most 1 each): a first by address.
    # a: decode a:0 (4 GiB left), prefill 0 slots: a miss. b: decode b:0, prefill b:1.
    ([labelled("a", [24]), labelled("b", [24, 24])], [], (NODE_LAYER, "b"), [("b", [0])], [("b", [1])]),
    # a [24], b [24]: no host holds two members and no layer is labelled: the cluster. Decode slots
    # a 1, b 1: the roomiest first, then the earlier worker: a; prefill slots a 0, b 1: b.
    ([labelled("a", [24]), labelled("b", [24])], [], None, [("a", [0])], [("b", [0])]),
    # the same two hosts in zone z1: the zone holds the group, so that is its domain
    ([labelled("a", [24], zone="z1"), labelled("b", [24], zone="z1")], [], (ZONE_LAYER, "z1"),
     [("a", [0])], [("b", [0])]),
    # partly full: a [24, 24] holds another model's 20 GiB on GPU 0, b [24, 24] is free. Sized a 1,
    # b 1; a first: decode a:1, prefill a:0 and a:1 have 4 GiB each: a miss; b holds both.
    ([labelled("a", [24, 24]), labelled("b", [24, 24])], [inst("o-1", "o", "a", [0], {0: 20 * GiB})],
     (NODE_LAYER, "b"), [("b", [0])], [("b", [1])]),
])
def test_formation_takes_the_first_host_or_layer_that_holds_the_group(workers, instances, domain, decode, prefill):
    g = form(cluster(workers, instances), group(), reqs())
    assert g.scheduled and g.domain == domain
    assert (at(g, D), at(g, P)) == (decode, prefill)


def racks(busy=False):
    # r2 = x, y, z and r1 = p, q, one 24 GiB GPU each; r2 comes first in the snapshot
    ws = [labelled(n, [24], rack="r2") for n in "xyz"] + [labelled(n, [24], rack="r1") for n in "pq"]
    return cluster(ws, [inst("o-1", "o", "p", [0], {0: 10 * GiB})] if busy else [])


@pytest.mark.parametrize("busy,domain,decode,prefill", [
    # fresh: no host holds two members. Racks sized by decode slots: r2 = 3, r1 = 2: the smaller r1
    # first, and it holds the group (decode p, prefill q); snapshot order would have taken r2.
    (False, "r1", "p", "q"),
    # partly full: p holds 10 GiB (14 left < 20), so r1 sizes 1 and is still tried first: decode q,
    # then prefill finds p 0 and q 0 (4 GiB left): a miss holding 1. r2: decode x, prefill y.
    (True, "r2", "x", "y"),
])
def test_smallest_fitting_rack_first(busy, domain, decode, prefill):
    g = form(racks(busy), group(), reqs())
    assert g.domain == (RACK_LAYER, domain)
    assert (at(g, D)[0][0], at(g, P)[0][0]) == (decode, prefill)


def test_equal_racks_go_by_address():
    # r2 = c, d first in the snapshot, r1 = a, b: both sized 2; the tie goes to the address, r1
    ws = [labelled("c", [24], rack="r2"), labelled("d", [24], rack="r2"),
          labelled("a", [24], rack="r1"), labelled("b", [24], rack="r1")]
    assert form(cluster(ws), group(), reqs()).domain == (RACK_LAYER, "r1")


def test_members_are_dealt_round_the_workers():
    # 2P2D on a, b [24, 24] in rack r1. A host holds 2 members: a miss at the host layer. In r1:
    # decode slots a 2, b 2, dealt one at a time: a, b; prefill slots a 1, b 1, one member each
    # already: a, b. Every host holds one pair: pair = (1*1 + 1*1) / (2*2) = 0.5 (filling a first
    # would put both decodes on a and both prefills on b: pair 0).
    ws = [labelled("a", [24, 24], rack="r1"), labelled("b", [24, 24], rack="r1")]
    g = form(cluster(ws), group(prefill=2, decode=2), reqs())
    assert [w for w, _ in at(g, D)] == ["a", "b"] and [w for w, _ in at(g, P)] == ["a", "b"]
    assert g.terms == {"pair": 0.5}


def test_the_hungriest_role_is_dealt_first():
    # h [24, 24, 16]; prefill takes 2 GPUs of 20 GiB (gpus_per_replica 2), decode one of 10 GiB.
    # Prefill first (2 GPUs a member against 1): GPUs 0 and 1, then decode the 16 GiB GPU 2. By name
    # alone decode would go first, onto GPU 0, and prefill would find one GPU with 20 GiB: no fit.
    g = form(cluster([labelled("h", [24, 24, 16])]),
             group(prefill_kw={"gpu_selector": {"gpus_per_replica": 2}}), reqs(p=40, d=10))
    assert g.scheduled and at(g, P) == [("h", [0, 1])] and at(g, D) == [("h", [2])]


# ---- MustGather and PreferGather at each layer ----

def fabric(nvl=("n1", "n1")):
    # zone z1: rack r1 = a, b (NVLink domains nvl[0], nvl[1]), rack r2 = c; zone z2: rack r3 = d
    ws = [labelled("a", [24], "z1", "r1", nvl[0]), labelled("b", [24], "z1", "r1", nvl[1]),
          labelled("c", [24], "z1", "r2"), labelled("d", [24], "z2", "r3")]
    snap = cluster(ws)
    return snap.model_copy(update={"topology": [NVL_LAYER]})


@pytest.mark.parametrize("strategy,layer,nvl,domain,unmet", [
    # no host holds two members; the custom layer (under rack) is the next: n1 = a, b holds them
    ("MustGather", NVL, ("n1", "n1"), (NVL, "n1"), False),
    # a and b on two fabrics: the custom layer holds nobody's pair; rack r1 does
    ("MustGather", RACK_LAYER, ("n1", "n2"), (RACK_LAYER, "r1"), False),
    # MustGather zone: the tightest layer holding the group wins, rack r1, tighter than asked
    ("MustGather", ZONE_LAYER, ("n1", "n2"), (RACK_LAYER, "r1"), False),
    # PreferGather host: no host holds both; it goes on up to rack r1 and reports gather_unmet
    ("PreferGather", NODE_LAYER, ("n1", "n2"), (RACK_LAYER, "r1"), True),
    ("PreferGather", RACK_LAYER, ("n1", "n2"), (RACK_LAYER, "r1"), False),
])
def test_gather_at_each_layer(strategy, layer, nvl, domain, unmet):
    g = form(fabric(nvl), group(gather=(strategy, layer)), reqs())
    assert g.scheduled and g.domain == domain
    assert (g.degradations == ["gather_unmet"]) == unmet


@pytest.mark.parametrize("layer,nvl,decode,head", [
    # host: each of a, b, c, d (sized 1, by address) takes decode, none prefill: a miss of 1 each;
    # the last of equals, d, is the roomiest
    (NODE_LAYER, ("n1", "n1"), 1, "The group needs 2 placements in one host (builtin-000004, MustGather), and "
                                  "the roomiest (host d) holds 1: prefill does not fit there."),
    # the custom layer with a and b on two fabrics: n1 and n2 each hold one member
    (NVL, ("n1", "n2"), 1, "The group needs 2 placements in one nvlink (custom-0000aa, MustGather), and the "
                           "roomiest (nvlink z1 / r1 / n2) holds 1: prefill does not fit there."),
    # 1P2D in one rack: r2 and r3 hold 1 each, r1 (a, b) holds both decodes and no prefill: 2
    (RACK_LAYER, ("n1", "n2"), 2, "The group needs 3 placements in one rack (builtin-000003, MustGather), and the "
                                  "roomiest (rack z1 / r1) holds 2: prefill does not fit there."),
])
def test_must_gather_refuses_at_its_layer(layer, nvl, decode, head):
    g = form(fabric(nvl), group(decode=decode, gather=("MustGather", layer)), reqs())
    assert not g.scheduled and g.members == [] and g.role == P
    assert g.reasons[0] == head
    # the role's hosts' reasons follow: its own decision where the group came closest
    assert "prefill: single_gpu: The largest allocatable GPU has 4.0 GiB; the model needs 20.0 GiB on one GPU." \
        in g.reasons


@pytest.mark.parametrize("zones,domain,shared", [
    # a in rack r1, b in rack r2, both zone z1: no rack holds the pair; zone z1 does: looser than rack
    (("z1", "z1"), (ZONE_LAYER, "z1"), "one zone"),
    # two zones: only the cluster holds them
    (("z1", "z2"), None, "only the cluster"),
])
def test_prefer_gather_widens_and_reports(zones, domain, shared):
    ws = [labelled("a", [24], zones[0], "r1"), labelled("b", [24], zones[1], "r2")]
    g = form(cluster(ws), group(gather=("PreferGather", RACK_LAYER)), reqs())
    assert g.scheduled and g.domain == domain and g.degradations == ["gather_unmet"]
    assert g.reasons[-1] == f"gather_unmet: PreferGather asked for one rack; the prefill and decode members share {shared}."


def test_unlabelled_hosts_gather_in_no_rack():
    # a carries rack r1, b carries no rack label: b is in no rack domain (its position is unknown)
    ws = [labelled("a", [24], rack="r1"), labelled("b", [24])]
    g = form(cluster(ws), group(gather=("MustGather", RACK_LAYER)), reqs())
    assert not g.scheduled and "roomiest (rack r1) holds 1" in g.reasons[0]


def test_a_group_that_does_not_fit_names_the_role():
    # decode 30 GiB fits no 24 GiB GPU anywhere: decode (dealt first) does not fit; nothing placed
    g = form(cluster([labelled("a", [24]), labelled("b", [24])]), group(), reqs(d=30))
    assert not g.scheduled and g.members == [] and g.role == D
    assert g.reasons[0] == "The group needs 2 placements and the cluster has room for 0: decode does not fit."
    assert "decode: single_gpu: The largest allocatable GPU has 24.0 GiB; the model needs 30.0 GiB on one GPU." \
        in g.reasons


# ---- the router: RAM only, last, beside the members ----

def test_router_goes_beside_the_members():
    # c (no GPU, zone z1) and d (no GPU, zone z2) come first; the pair lands on a (decode) and b
    # (prefill), zone z1. The router's candidates a, b, c, d (2 GiB of RAM each, no GPU): a and b
    # share the host with a member (150 * 2 layers), c the zone (150), d nothing; spread then
    # breaks a and b's tie (one member each) by order: a.
    ws = [worker("c", 64, labels={"topology.gpustack.ai/zone": "z1"}),
          worker("d", 64, labels={"topology.gpustack.ai/zone": "z2"}),
          labelled("a", [24], "z1"), labelled("b", [24], "z1")]
    g = form(cluster(ws), group(router=True), reqs())
    (r,) = g.of(R)
    assert (r.worker, r.gpu_indexes, r.decision.placement.claim.ram) == ("a", [], 2 * GiB)
    assert [c.worker for c in r.decision.candidates] == ["c", "d", "a", "b"]


@pytest.mark.parametrize("gather,router_at", [
    # h [24, 24] with 4 GiB of RAM: the pair books 1 + 1 GiB, 2 left; a 3 GiB router does not fit there.
    # MustGather host: the router must stay inside host h: refused, naming the router
    (("MustGather", NODE_LAYER), None),
    # PreferGather: the router may go anywhere in the cluster: c (no GPU)
    (("PreferGather", NODE_LAYER), "c"),
])
def test_router_that_does_not_fit_beside_the_members(gather, router_at):
    ws = [labelled("h", [24, 24], ram=4), worker("c", 64)]
    g = form(cluster(ws), group(router=3 * GiB, gather=gather), reqs())
    if router_at is None:
        assert not g.scheduled and g.role == R and g.members == []
        assert g.reasons[0] == ("The group's prefill and decode members fit in host h, but nothing in host h has "
                                "room for its router.")
    else:
        assert g.domain == (NODE_LAYER, "h") and g.of(R)[0].worker == router_at


# ---- a mixed-vendor cluster: the PD mode's vendors, narrowed by disaggregation.vendor ----

def mixed():
    # m1, m2: AMD (rocm), n1, n2: NVIDIA, one 24 GiB GPU each, AMD first in the snapshot
    return cluster([worker("m1", 64, [gpu(0, 24, "rocm", "amd")]), worker("n1", 64, [gpu(0, 24)]),
                    worker("m2", 64, [gpu(0, 24, "rocm", "amd")]), worker("n2", 64, [gpu(0, 24)])])


@pytest.mark.parametrize("mode,vendor,decode,prefill", [
    # vllm-nixl, no vendor: derived from the recipe (nvidia); AMD hosts are out
    ("vllm-nixl", None, "n1", "n2"),
    ("vllm-nixl", "nvidia", "n1", "n2"),  # given
    ("custom", "amd", "m1", "m2"),  # custom narrows only by the vendor given
    ("custom", None, "m1", "n1"),  # custom without a vendor: no narrowing, as GPUStack (the group spans vendors)
])
def test_mixed_vendor_cluster(mode, vendor, decode, prefill):
    # vLLM books 21.6 GiB of a 24 GiB GPU: one member a host, so the cluster holds the pair
    g = form(mixed(), group(backend="vllm", mode=mode, vendor=vendor), reqs())
    assert (at(g, D)[0][0], at(g, P)[0][0]) == (decode, prefill)


def test_a_vendor_the_connector_cannot_speak_is_refused_at_validation():
    with pytest.raises(ValueError, match="disaggregation.vendor amd: mode vllm-nixl's connector runs on nvidia only"):
        group(backend="vllm", mode="vllm-nixl", vendor="amd")


def test_ascend_mode_in_a_cluster_without_ascend():
    g = form(mixed(), group(backend="vllm", mode="vllm-ascend-mooncake"), reqs())
    assert not g.scheduled and g.role == D
    assert "decode: pd_mode: worker n1: its GPUs' vendor (nvidia) is not ascend, required by pd mode " \
           "vllm-ascend-mooncake" in g.reasons


def test_kv_connectors_keep_members_where_the_connector_runs():
    # vllm-mooncake: n1 reports only nixl (out), n2 reports nothing (kept: unknown), n3 mooncake
    ws = [worker("n1", 64, [gpu(0, 24)], kv_connectors=["nixl"]), worker("n2", 64, [gpu(0, 24)]),
          worker("n3", 64, [gpu(0, 24)], kv_connectors=["mooncake", "nixl"])]
    g = form(cluster(ws), group(backend="vllm", mode="vllm-mooncake"), reqs())
    assert (at(g, D)[0][0], at(g, P)[0][0]) == ("n2", "n3")
    g = form(cluster(ws[:2]), group(backend="vllm", mode="vllm-mooncake"), reqs())
    assert not g.scheduled and ("prefill: pd_mode: worker n1: its engines cannot run the mooncake KV connector "
                                "pd mode vllm-mooncake needs (it reports: nixl)") in g.reasons


# ---- deliberate differences (docs/gpustack-differences.md) ----

def test_must_gather_at_a_layer_no_host_carries_is_refused():
    # GPUStack drops a MustGather whose layer is not among the cluster's scopes and places the group
    # as if nothing was asked; gpuflow refuses, naming the layer and the labels that would place a host
    g = form(cluster([labelled("a", [24, 24])]), group(gather=("MustGather", RACK_LAYER)), reqs())
    assert not g.scheduled and g.members == []
    assert g.reasons == ["gather MustGather at rack (builtin-000003): no host carries any of its labels "
                         "(topology.gpustack.ai/rack, topology.kubernetes.io/rack), so no rack can hold the group; "
                         "it is refused rather than spread."]


def test_hosts_unclassified_below_a_shared_zone_share_the_zone():
    # a and b in zone z1 without a rack label (c carries one, so rack is a layer): the pair lands in
    # z1. GPUStack's tree meets a and b in z1's unclassified rack bucket and calls that sharing
    # nothing, so it would report gather_unmet for PreferGather zone; here they share zone z1: met.
    ws = [labelled("a", [24], "z1"), labelled("b", [24], "z1"), labelled("c", [8], "z2", "r1")]
    g = form(cluster(ws), group(gather=("PreferGather", ZONE_LAYER)), reqs())
    assert g.domain == (ZONE_LAYER, "z1") and g.degradations == []
