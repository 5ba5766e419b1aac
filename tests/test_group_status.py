"""How a group stands (scheduler/groups/status.py): each role's running members against its wanted
replicas, and the degradations ratio_unmet and gather_unmet, from the members as they are."""

import pytest

from scheduler.groups.layers import RACK_LAYER, ZONE_LAYER
from scheduler.groups.spec import Gather, RoleName, RoleSpec
from scheduler.groups.status import MemberNow, counts, counts_text, degradations
from tests.conftest import cluster, gpu, worker

P, D, R = RoleName.PREFILL, RoleName.DECODE, RoleName.ROUTER
ROLES_2P2D = [RoleSpec(name=P, replicas=2), RoleSpec(name=D, replicas=2), RoleSpec(name=R)]


def host(name, zone=None, rack=None):
    labels = {k: v for k, v in (("topology.gpustack.ai/zone", zone), ("topology.gpustack.ai/rack", rack)) if v}
    return worker(name, 64, [gpu(0, 24)], labels=labels)


# zone z1 holds racks r1 (a, b) and r2 (c); zone z2 holds d (no rack label)
CLUSTER = cluster([host("a", "z1", "r1"), host("b", "z1", "r1"), host("c", "z1", "r2"), host("d", "z2")])


@pytest.mark.parametrize("members,text", [
    # 2 prefills running, 1 of 2 decodes running (the other pending), the router running
    ([MemberNow(P, "running", "a"), MemberNow(P, "running", "b"), MemberNow(D, "running", "a"),
      MemberNow(D, "pending"), MemberNow(R, "running", "a")], "prefill 2/2, decode 1/2, router 1/1"),
    # nothing formed yet: every role 0 of what it wants
    ([], "prefill 0/2, decode 0/2, router 0/1"),
    # a stopping member is not running: it does not count
    ([MemberNow(P, "stopping", "a")], "prefill 0/2, decode 0/2, router 0/1"),
])
def test_each_roles_running_members_against_its_replicas(members, text):
    assert counts_text(counts(ROLES_2P2D, members)) == text


def running(*where):
    """Members running: (role, worker) pairs."""
    return [MemberNow(role, "running", w) for role, w in where]


ALL_UP = [(P, "a"), (P, "b"), (D, "a"), (D, "b"), (R, "a")]


@pytest.mark.parametrize("gather,members,kinds", [
    # every role at its count, no gather asked: nothing
    (None, running(*ALL_UP), []),
    # a decode short: ratio_unmet (2 prefills serve beside 1 decode, not the 2:2 the spec states)
    (None, running(*ALL_UP[:3], ALL_UP[4]), ["ratio_unmet"]),
    # the router down is a role short too
    (None, running(*ALL_UP[:4]), ["ratio_unmet"]),
    # PreferGather rack: a, b share rack r1: met
    (Gather(strategy="PreferGather", layer=RACK_LAYER), running(*ALL_UP), []),
    # PreferGather rack: a decode on c (rack r2): a, b, c share only zone z1: gather_unmet
    (Gather(strategy="PreferGather", layer=RACK_LAYER), running((P, "a"), (P, "b"), (D, "a"), (D, "c"), (R, "a")),
     ["gather_unmet"]),
    # ... but PreferGather zone is met by zone z1
    (Gather(strategy="PreferGather", layer=ZONE_LAYER), running((P, "a"), (P, "b"), (D, "a"), (D, "c"), (R, "a")), []),
    # a decode on d (zone z2): a, b, d share only the cluster: zone unmet; and a decode short besides
    (Gather(strategy="PreferGather", layer=ZONE_LAYER), running((P, "a"), (P, "b"), (D, "d"), (R, "a")),
     ["ratio_unmet", "gather_unmet"]),
    # the router is not an anchor: a router on d leaves the gang in rack r1, met
    (Gather(strategy="PreferGather", layer=RACK_LAYER), running(*ALL_UP[:4], (R, "d")), []),
    # MustGather never reports gather_unmet (it places nothing looser); PreferGather without a layer asked nothing
    (Gather(strategy="MustGather", layer=RACK_LAYER), running((P, "a"), (P, "b"), (D, "a"), (D, "c"), (R, "a")), []),
    (Gather(strategy="PreferGather"), running((P, "a"), (P, "b"), (D, "a"), (D, "d"), (R, "a")), []),
])
def test_degradations(gather, members, kinds):
    assert degradations(ROLES_2P2D, gather, members, CLUSTER) == kinds
