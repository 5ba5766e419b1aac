"""The topology fields of the snapshot, how a pair of GPUs is judged (scheduler/interconnect.py),
CPU lists, and topology_policy on placements across workers (scheduler/topology_policy.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from scheduler import cpulist, interconnect, topology_policy
from scheduler.cluster import ClusterSnapshot, Worker
from scheduler.decision import Candidate, PlannedClaim, PlannedSubordinate
from scheduler.spec import TopologyPolicy


def worker(*gpus, name="w") -> Worker:
    return Worker(name=name, ram_total=2**40, gpus=[{"index": i, "vram_total": 2**30, **g} for i, g in enumerate(gpus)])


@pytest.mark.parametrize("a, b, level", [
    ({"nvlink_peers": [1], "links": {1: "system"}}, {}, "nvlink"),  # NVLink first, named on one side is enough
    ({"links": {1: "hostbridge"}, "pcie_switch": "s"}, {"pcie_switch": "s"}, "hostbridge"),  # NVML's path beats a switch id
    ({"pcie_switch": "s", "numa_node": 0}, {"pcie_switch": "s", "numa_node": 1}, "single"),
    ({"numa_node": 0}, {"numa_node": 0}, "node"),
    ({"numa_node": 0}, {"numa_node": 1}, "system"),
    ({"numa_node": 0}, {}, None),  # the other GPU does not say: unknown
    ({}, {}, None),
])
def test_pair_levels(a, b, level):
    w = worker(a, b)
    assert interconnect.pair(w.gpus[0], w.gpus[1]) == level


def test_a_set_is_as_good_as_its_worst_pair():
    # 0-1 NVLink, 2 on the same node, 3 across: scores 100, 50, 0
    w = worker({"numa_node": 0, "nvlink_peers": [1]}, {"numa_node": 0}, {"numa_node": 0}, {"numa_node": 1})
    assert [(interconnect.level(w, s), interconnect.score(w, s)) for s in ([0, 1], [0, 1, 2], [0, 3], [0])] == [
        ("nvlink", 100.0), ("node", 50.0), ("system", 0.0), ("internal", 90.0)]
    assert interconnect.reports(w) and not interconnect.reports(worker({}, {}))


@pytest.mark.parametrize("gpu, message", [
    ({"nvlink_peers": [7]}, "GPU 0: nvlink_peers/links name GPU 7, which is not another GPU of this worker"),
    ({"nvlink_peers": [0]}, "GPU 0: nvlink_peers/links name GPU 0, which is not another GPU of this worker"),
    ({"links": {1: "pix"}}, "Input should be 'internal', 'single', 'multiple', 'hostbridge', 'node' or 'system'"),
    ({"cpus": "0-3,x"}, "'0-3,x' is not a CPU list (example: '0-15,32-47'): bad part 'x'"),
    ({"cpus": "8-4"}, "range '8-4' runs backwards"),
    ({"numa_node": -1}, "greater than or equal to 0"),
])
def test_bad_topology_is_refused_with_the_field(gpu, message):
    with pytest.raises(ValidationError) as e:
        ClusterSnapshot.model_validate({"workers": [{"name": "w", "ram_total": 1, "gpus": [
            {"index": 0, "vram_total": 1, **gpu}, {"index": 1, "vram_total": 1}]}]})
    assert message in str(e.value)


def test_cpu_lists_are_kept_short():
    assert worker({"cpus": [3, 0, 1, 2, 8]}).gpus[0].cpus == "0-3,8"
    assert worker({"cpus": "0-31, 64-95"}).gpus[0].cpus == "0-31,64-95"
    assert cpulist.parse("0-2,7") == [0, 1, 2, 7] and cpulist.format([]) == ""


def cand(worker_name, gpus, subs=()):
    return Candidate(worker_name, list(gpus), PlannedClaim(),
                     [PlannedSubordinate(w, list(g), PlannedClaim()) for w, g in subs])


def test_policies_check_each_workers_part():
    a = worker(*[{"numa_node": i // 2} for i in range(4)], name="a")  # nodes: 0 0 1 1
    b = worker(*[{"numa_node": i // 2} for i in range(4)], name="b")
    snap = ClusterSnapshot(workers=[a, b])
    across = cand("a", [0, 1], [("b", [1, 2])])  # a's part on one node, b's part on two
    assert topology_policy.check(snap, TopologyPolicy.SINGLE_NUMA_NODE, across) == \
        "single-numa-node: GPUs 1 and 2 are on NUMA nodes 0 and 1 (worker b)"
    assert topology_policy.check(snap, TopologyPolicy.BEST_EFFORT, across) is None
    # restricted: 3 GPUs cannot be on one node of 2, so spanning 2 nodes is what it prefers
    assert topology_policy.check(snap, TopologyPolicy.RESTRICTED, cand("a", [0, 1, 2])) is None
    assert topology_policy.check(snap, TopologyPolicy.RESTRICTED, cand("a", [1, 2])).startswith("restricted: GPUs 1 and 2")
    kept, why = topology_policy.keep(snap, TopologyPolicy.SINGLE_NUMA_NODE,
                                     [cand("a", [1, 2]), cand("a", [2, 3]), cand("b", [0, 3])])
    assert [c.gpu_indexes for c in kept] == [[2, 3]] and len(why) == 2
