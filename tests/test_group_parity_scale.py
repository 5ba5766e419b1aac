"""A group's scale-out and scale-in where gpuflow follows GPUStack 2.3.0 (issue 41's parity list):
scheduler/scheduler.py find_candidate for a member with a group (PDModeRuntimeFilter, GatherFloorFilter
under MustGather, TopologyProximityScorer, PairingAffinityScorer sized by _pairing_affinity_max_score)
and server/controllers.py find_scale_down_candidates with peers (StatusScorer, OffloadLayerScorer,
PairingRetentionScorer, PlacementScorer in removal mode). GPUStack's numbers are the expected values;
each row's comment shows its arithmetic. Deliberate differences are in docs/gpustack-differences.md.

The clusters: hosts of two 24 GiB GPUs; every member books 10 GiB on one GPU (a full GPU: 24 GiB),
so each candidate is one GPU and the placement scorer spreads (GPUStack's default for these models):
a host holding n GPU slots of the deployment, among hosts some of which hold none, scores
(0.85 * (0.45 + 0.35 * inv(n) + 0.20) + 0.15 * g) * 100 and an empty host 100; g = 1 / (1 + the
deployment's members on that GPU)."""

import pytest

from scheduler.cluster import InstanceState
from scheduler.groups.layers import RACK_LAYER, ZONE_LAYER
from scheduler.groups.scale_in import scale_in
from scheduler.groups.scale_out import scale_out
from scheduler.groups.spec import RoleName
from scheduler.request import FlatRequest
from scheduler.spec import ModelSpec
from scheduler.units import GiB
from tests.conftest import cluster, gpu, inst, worker

ZONE, RACK = "topology.gpustack.ai/zone", "topology.gpustack.ai/rack"
REQ = FlatRequest(vram=10 * GiB, ram=GiB)
P, D = RoleName.PREFILL, RoleName.DECODE


def group(prefill=1, decode=1, **kw):
    return ModelSpec(name="g", source={"huggingface": {"repo": "org/m"}}, backend="custom", run_command="x {port}",
                     roles=[{"name": "prefill", "replicas": prefill}, {"name": "decode", "replicas": decode}],
                     disaggregation={"mode": "custom"}, **kw)


def host(name, zone=None, rack=None):
    labels = {k: v for k, v in ((ZONE, zone), (RACK, rack)) if v}
    return worker(name, 64, [gpu(0, 24), gpu(1, 24)], labels=labels)


def m(name, role, worker_, gpu_=0, gib=10, state=InstanceState.RUNNING):
    return inst(name, "g", worker_, [gpu_], {gpu_: int(gib * GiB)}, role=role, group="g", state=state)


def points(d):
    """Each host's best candidate: its total and the scorers' points, rounded."""
    out = {}
    for c in d.candidates:
        if c.worker not in out or c.score > out[c.worker][0]:
            out[c.worker] = (round(c.score, 2), {k: round(v, 2) for k, v in c.scores.items() if v})
    return out


# ---- scale-out after a skewed start: 3P1D, a: p1 p2, b: p3 d1, c: empty ----
# No host carries a zone or rack label: the layers are the host alone (depth 1), so proximity pays
# 150 to a host holding a prefill or decode, and W = max(200, placement 100 + locality 5 +
# proximity 150 * 1 + 1) = 256 per opposite member beside the candidate.
# Placement: a and b hold 2 slots each (all roles count: GPUStack counts by model), c none:
# a, b = (0.85 * (0.45 + 0 + 0.20) + 0.15 * 0.5) * 100 = 62.75; c = 100.
SKEWED = [m("p1", "prefill", "a"), m("p2", "prefill", "a", 1), m("p3", "prefill", "b"), m("d1", "decode", "b", 1)]


@pytest.mark.parametrize("role,expected,placed", [
    # a prefill goes where the decode is: b = 62.75 + 150 + 256 * 1 = 468.75; a = 62.75 + 150 =
    # 212.75 (two prefills there are worth nothing to a prefill); c = 100. The group-count rule
    # ("most of the group") would pick a or b alike and move sum p_j * d_j by nothing on a.
    (P, {"a": (212.75, {"placement": 62.75, "proximity": 150.0}),
         "b": (468.75, {"placement": 62.75, "proximity": 150.0, "pairing": 256.0}),
         "c": (100.0, {"placement": 100.0})}, "b"),
    # a decode goes where the prefills are: a = 62.75 + 150 + 256 * 2 = 724.75; b = 62.75 + 150 +
    # 256 * 1 = 468.75; c = 100
    (D, {"a": (724.75, {"placement": 62.75, "proximity": 150.0, "pairing": 512.0}),
         "b": (468.75, {"placement": 62.75, "proximity": 150.0, "pairing": 256.0}),
         "c": (100.0, {"placement": 100.0})}, "a"),
])
def test_scale_out_after_a_skewed_start(role, expected, placed):
    d = scale_out(cluster([host("a"), host("b"), host("c")], SKEWED), group(3), role, REQ, "g")
    assert points(d) == expected
    assert (d.placement.worker, d.placement.gpu_indexes) == (placed, [0])  # GPUs tie (one slot each): the first


def test_a_burst_of_prefills_follows_the_decode_still_starting():
    # the decode on b is STARTING (GPUStack counts members by worker, not by RUNNING: it holds b's
    # GPU and will pair from there). After p4 lands on b's GPU 0 (p3 + p4 = 20 GiB: GPU 0 has 4 GiB
    # left), p5 goes to b's GPU 1: b holds 3 slots, a 2, c none: b = (0.85 * (0.45 + 0.35 * 0 +
    # 0.20) + 0.15 * 0.5) * 100 + 150 + 256 = 468.75; a = (0.85 * (0.45 + 0.35 * (1 - 2/3) + 0.20)
    # + 0.075) * 100 + 150 = 72.67 + 150 = 222.67; c = 100
    members = [*SKEWED[:3], m("d1", "decode", "b", 1, state=InstanceState.STARTING), m("p4", "prefill", "b", 0)]
    d = scale_out(cluster([host("a"), host("b"), host("c")], members), group(5), P, REQ, "g")
    assert points(d)["b"][0] == 468.75 and points(d)["a"][0] == 222.67
    assert (d.placement.worker, d.placement.gpu_indexes) == ("b", [1])


# ---- proximity by layer: h1 holds d1 and p1 and is full; the new prefill's hosts are empty ----
# Placement is 100 on each empty host; pairing pays nothing (the decode's host is full).

@pytest.mark.parametrize("labels,expected,placed", [
    # zone and rack: depths zone 1, rack 2, host 3. h2 shares h1's rack: 150 * 2 = 300; h3 its
    # zone: 150; h4 nothing: 0. W = max(200, 100 + 5 + 450 + 1) = 556 (GPUStack's note: the 200
    # written down was beaten by 100 + 5 + 450 = 555)
    ({"h1": ("z1", "r1"), "h2": ("z1", "r1"), "h3": ("z1", "r2"), "h4": ("z2", "r3")},
     {"h2": 400.0, "h3": 250.0, "h4": 100.0}, "h2"),
    # zone only (nobody carries rack: not a layer): depths zone 1, host 2. h2 and h3 share the
    # zone: 150 each; the tie goes to the first candidate, h2
    ({"h1": ("z1", None), "h2": ("z1", None), "h3": ("z1", None), "h4": ("z2", None)},
     {"h2": 250.0, "h3": 250.0, "h4": 100.0}, "h2"),
    # a rack named alike in another zone is another rack: h4 (z2, r1) shares nothing with h1
    # (z1, r1): 0; h3 (z1, r2) shares the zone: 150
    ({"h1": ("z1", "r1"), "h3": ("z1", "r2"), "h4": ("z2", "r1")}, {"h2": 100.0, "h3": 250.0, "h4": 100.0}, "h3"),
])
def test_proximity_by_layer(labels, expected, placed):
    hosts = [host(n, *labels.get(n, (None, None))) for n in ("h1", "h2", "h3", "h4")]
    full = [m("d1", "decode", "h1", 0, gib=24), m("p1", "prefill", "h1", 1, gib=24)]
    d = scale_out(cluster(hosts, full), group(2), P, REQ, "g")
    assert {w: s for w, (s, _) in points(d).items()} == pytest.approx(expected)
    assert d.placement.worker == placed


def test_pairing_weight_by_layers():
    # the W a prefill beside the decode is paid, by the layers the hosts carry: 256 (host), 406
    # (zone: 100 + 5 + 150 * 2 + 1), 556 (zone and rack: 100 + 5 + 150 * 3 + 1)
    for labels, w in (((None, None), 256.0), (("z1", None), 406.0), (("z1", "r1"), 556.0)):
        snap = cluster([host("a", *labels), host("b", *labels)], [m("d1", "decode", "a")])
        d = scale_out(snap, group(), P, REQ, "g")
        assert points(d)["a"][1]["pairing"] == w


def test_a_zone_without_racks_is_still_shared():
    # DIFFERENCE (docs/gpustack-differences.md): h1, h2 in zone z1 without a rack label; h3 in
    # z1 rack r2 (so rack is a layer); h4 in z2. GPUStack's tree puts h1 and h2 in z1's
    # unclassified rack bucket and common_layer stops there: h2 scores 0, h3 150 (zone), and h3
    # wins. gpuflow reads the zone they share: h2 150, h3 150, and the tie goes to h2.
    hosts = [host("h1", "z1"), host("h2", "z1"), host("h3", "z1", "r2"), host("h4", "z2")]
    full = [m("d1", "decode", "h1", 0, gib=24), m("p1", "prefill", "h1", 1, gib=24)]
    d = scale_out(cluster(hosts, full), group(2), P, REQ, "g")
    assert {w: s for w, (s, _) in points(d).items()} == pytest.approx({"h2": 250.0, "h3": 250.0, "h4": 100.0})
    assert d.placement.worker == "h2"


# ---- scale-out under MustGather and PreferGather: h1 (z1, r1) holds d1 and p1 and is full,
# h2 (z1, r1) is full of another deployment, h3 (z1, r2) and h4 (z2, r3) are empty ----

@pytest.mark.parametrize("strategy,layer,placed", [
    # MustGather rack: GatherFloorFilter keeps h1 and h2 (rack z1/r1), both full: not placed
    ("MustGather", RACK_LAYER, None),
    # MustGather zone: h1, h2, h3 kept; h3 is the one with room (proximity 150: the zone)
    ("MustGather", ZONE_LAYER, "h3"),
    # PreferGather rack: no floor (a target, reported as gather_unmet, never a refusal); h3
    # shares the zone (100 + 150) over h4 (100)
    ("PreferGather", RACK_LAYER, "h3"),
])
def test_scale_out_under_gather(strategy, layer, placed):
    hosts = [host("h1", "z1", "r1"), host("h2", "z1", "r1"), host("h3", "z1", "r2"), host("h4", "z2", "r3")]
    held = [m("d1", "decode", "h1", 0, gib=24), m("p1", "prefill", "h1", 1, gib=24),
            inst("o1", "other", "h2", [0], {0: 24 * GiB}), inst("o2", "other", "h2", [1], {1: 24 * GiB})]
    d = scale_out(cluster(hosts, held), group(2, gather={"strategy": strategy, "layer": layer}), P, REQ, "g")
    assert (d.placement.worker if d.scheduled else None) == placed
    floor = next((v for v in d.filters if v.name == "gather_floor"), None)
    if strategy == "MustGather":
        assert sorted(floor.removed) == (["h3", "h4"] if layer == RACK_LAYER else ["h4"])
    else:
        assert floor is None


# ---- scale-in: the role's member with the lowest status*100 + offload*10 + retention*20 +
# placement*1 goes; retention = 20 * opposite members beside it / the most on any worker ----

@pytest.mark.parametrize("role,members,victim", [
    # 3P1D: p1, p2 on a with no decode (retention 0), p3 beside d1 (20): p1 and p2 tie at 100 +
    # the same placement; the first goes
    (P, SKEWED, "p1"),
    # decodes a 2, b 1: p1 on a 20 * 2/2 = 20, p2 on b 20 * 1/2 = 10, p3 on c 0: p3
    (P, [m("d1", "decode", "a"), m("d2", "decode", "a", 1), m("d3", "decode", "b"), m("p1", "prefill", "a"),
         m("p2", "prefill", "b", 1), m("p3", "prefill", "c")], "p3"),
    # the reverse for a decode: prefills a 2, b 1: d1 on a 20, d2 on b 10: d2
    (D, [m("p1", "prefill", "a"), m("p2", "prefill", "a", 1), m("p3", "prefill", "b"), m("d1", "decode", "a"),
         m("d2", "decode", "b", 1)], "d2"),
    # a broken member goes first however many partners: p1 ERROR beside d1: 0 + 20 = 20 against
    # p2 running alone: 100
    (P, [m("p1", "prefill", "a", state=InstanceState.ERROR), m("d1", "decode", "a", 1), m("p2", "prefill", "b")], "p1"),
    # a starting member before a running one: p1 STARTING beside d1: 50 + 20 = 70 < 100
    (P, [m("p1", "prefill", "a", state=InstanceState.STARTING), m("d1", "decode", "a", 1), m("p2", "prefill", "b")], "p1"),
    # a tie (each prefill beside one decode, the same placement): the first in order goes ...
    (P, [m("p1", "prefill", "a"), m("d1", "decode", "a", 1), m("p2", "prefill", "b"), m("d2", "decode", "b", 1)], "p1"),
    # ... so the order decides it
    (P, [m("p2", "prefill", "b"), m("d2", "decode", "b", 1), m("p1", "prefill", "a"), m("d1", "decode", "a", 1)], "p2"),
])
def test_scale_in_victim(role, members, victim):
    ch = scale_in(cluster([host("a"), host("b"), host("c")], members), group(3, 2), role, "g")
    assert ch.victim == victim and ch.members[0].instance.name == victim
