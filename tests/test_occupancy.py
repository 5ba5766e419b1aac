"""scheduler/occupancy.py: the sums a decision reads (allocatable per worker, spread counts, whether
any worker reports topology) equal the per-decision computations they replace
(allocatable.allocatable_map, spread.count, topology.applies), whether built from a snapshot,
derived from the previous snapshot's after changes (as the snapshot cache does), or with the
instance being re-placed left out; and decisions on a derived occupancy equal decisions on a
built one."""

from __future__ import annotations

import pytest

from scheduler import occupancy
from scheduler.allocatable import allocatable_map
from scheduler.cluster import ClusterSnapshot
from scheduler.decide import decide
from scheduler.request import FlatRequest
from scheduler.scorers import spread, topology
from scheduler.spec import ModelSpec
from scheduler.units import GiB
from tests.conftest import cluster, gpu, inst, worker
from tests.random_cluster import MODELS, changed, snapshot_dict

SEEDS = range(150)


def reference(snap: ClusterSnapshot, exclude: str | None):
    rest = [i for i in snap.instances if i.name != exclude]
    return (allocatable_map(snap, exclude), {m: spread.count(rest, m) for m in [*MODELS, "absent"]},
            topology.applies(snap))


def sums(occ: occupancy.Occupancy):
    return occ.allocatable, {m: occ.spread_counts(m) for m in [*MODELS, "absent"]}, occ.topology


def test_worked_example():
    # w1: GPUs 0 and 1 of 80 GiB, 100 GiB RAM. a (model m) holds GPU 0: 30 GiB, 4 GiB RAM.
    # b (model other) holds GPUs 0 and 1 (10 GiB each, 2 GiB RAM) and a subordinate on w2's GPU 0 (20 GiB).
    snap = cluster([worker("w1", 100, [gpu(0, 80), gpu(1, 80)]), worker("w2", 64, [gpu(0, 24)])],
                   [inst("a", "m", "w1", [0], {0: 30 * GiB}, ram=4 * GiB),
                    inst("b", "other", "w1", [0, 1], {0: 10 * GiB, 1: 10 * GiB}, ram=2 * GiB,
                         subordinates=[{"worker": "w2", "gpu_indexes": [0], "claim": {"vram": {0: 20 * GiB}}}])])
    occ = occupancy.of(snap)
    # w1: GPU 0 80-30-10 = 40, GPU 1 80-10 = 70, RAM 100-4-2 = 94; w2: GPU 0 24-20 = 4, RAM 64
    assert occ.allocatable["w1"].vram == {0: 40 * GiB, 1: 70 * GiB} and occ.allocatable["w1"].ram == 94 * GiB
    assert occ.allocatable["w2"].vram == {0: 4 * GiB} and occ.allocatable["w2"].ram == 64 * GiB
    # slots for m on w1: a's one GPU (cur 1); other models: b's two GPUs (oth 2), GPU 0 one of each
    assert occ.spread_counts("m")["w1"] == spread.Counts(1, 2, {0: 1}, {0: 1, 1: 1})
    # a re-placed: its own claim and slot leave (GPU 0 80-10 = 70, RAM 100-2 = 98, cur 0)
    again = occ.without("a")
    assert again.allocatable["w1"].vram == {0: 70 * GiB, 1: 70 * GiB} and again.allocatable["w1"].ram == 98 * GiB
    assert again.spread_counts("m")["w1"] == spread.Counts(0, 2, {}, {0: 1, 1: 1})
    assert occ.without("nobody") is occ and occupancy.of(snap) is occ  # remembered while the snapshot lives


@pytest.mark.parametrize("seed", SEEDS)
def test_built_equals_the_per_decision_computation(seed):
    snap = ClusterSnapshot.model_validate(snapshot_dict(seed))
    names = [i.name for i in snap.instances]
    for exclude in [None, "nobody", *names[:3]]:
        assert sums(occupancy.of(snap).without(exclude)) == reference(snap, exclude), exclude


def _successor(old: ClusterSnapshot, d_old: dict, d_new: dict):
    """The new snapshot as the cache builds it: unchanged workers and instances are the same
    objects; and the instances that left (old versions) and came (new versions)."""
    new = ClusterSnapshot.model_validate(d_new)
    ow = {w.name: (w, d) for w, d in zip(old.workers, d_old["workers"])}
    oi = {i.name: (i, d) for i, d in zip(old.instances, d_old["instances"])}
    workers = [ow[w.name][0] if w.name in ow and ow[w.name][1] == d else w for w, d in zip(new.workers, d_new["workers"])]
    insts, gone, came = {}, [], []
    for i, d in zip(new.instances, d_new["instances"]):
        if i.name in oi and oi[i.name][1] == d:
            insts[i.name] = oi[i.name][0]
        else:
            insts[i.name] = i
            came.append(i)
            if i.name in oi:
                gone.append(oi[i.name][0])
    gone += [i for n, (i, _) in oi.items() if n not in insts]
    snap = ClusterSnapshot.model_construct(version=1, workers=workers, instances=list(insts.values()),
                                           model_files=new.model_files)
    return snap, insts, gone, came


SPECS = [ModelSpec(name="m", source={"huggingface": {"repo": "o/m"}}, backend="custom", run_command="x",
                   cpu_offloading=True),
         ModelSpec(name="other", source={"huggingface": {"repo": "o/m"}}, backend="vllm", placement_strategy="binpack"),
         ModelSpec(name="m", source={"huggingface": {"repo": "o/m"}}, backend="sglang")]


@pytest.mark.parametrize("seed", SEEDS)
def test_derived_equals_built_and_decides_alike(seed):
    d_old = snapshot_dict(seed)
    old = ClusterSnapshot.model_validate(d_old)
    d_new = changed(seed, d_old)
    snap, insts, gone, came = _successor(old, d_old, d_new)
    derived = occupancy.of(old).derive(snap.workers, insts, gone, came)
    occupancy.remember(snap, derived)
    built = occupancy.build(snap.workers, snap.instances)
    assert sums(derived) == sums(built) == reference(snap, None)
    held = {w: (h.ram, {g: b for g, b in h.vram.items() if b}, h.slots) for w, h in derived.held.items()}
    assert held == {w: (h.ram, {g: b for g, b in h.vram.items() if b}, h.slots) for w, h in built.held.items()}
    fresh = snap.model_copy(update={"instances": list(snap.instances)})  # a new list: its own occupancy, built
    assert occupancy.of(fresh) is not derived
    for spec in SPECS:
        for exclude in [None, *[i.name for i in snap.instances][:2]]:
            for vram in (8, 30, 100):
                req = FlatRequest(vram=vram * GiB, ram=2 * GiB)
                a, b = decide(snap, spec, req, exclude=exclude), decide(fresh, spec, req, exclude=exclude)
                assert a.to_dict() == b.to_dict(), (spec.backend, exclude, vram)


@pytest.mark.parametrize("seed", SEEDS)
def test_spread_counts_carried_from_an_ancestor_equal_built(seed):
    # The old snapshot's counts are asked first (as a decision asks them), then the occupancy is
    # derived twice: the child counts from old's with only the changed workers counted again, and
    # the grandchild (its parent never asked) from old's too, with both steps' changes
    d_old = snapshot_dict(seed)
    old = ClusterSnapshot.model_validate(d_old)
    parent = occupancy.of(old)
    sums(parent)
    d_new = changed(seed, d_old)
    snap, insts, gone, came = _successor(old, d_old, d_new)
    child = parent.derive(snap.workers, insts, gone, came)
    middle = parent.derive(snap.workers, insts, gone, came)  # a sibling never asked: its child counts from old's
    back = middle.derive(old.workers, {i.name: i for i in old.instances}, came, gone)
    assert sums(child) == sums(occupancy.build(snap.workers, snap.instances)) == reference(snap, None)
    assert sums(back) == sums(occupancy.build(old.workers, old.instances)) == reference(old, None)
    for m, (counts, since) in child._bases.items():  # few changed: counted from old's (over a quarter: all again)
        assert counts is parent._counts[m] and back._bases[m][0] is counts and since <= back._bases[m][1]


def test_remembered_only_while_the_snapshot_lives():
    import gc

    before = len(occupancy._MEMO)
    snap = ClusterSnapshot.model_validate(snapshot_dict(7))
    occupancy.of(snap)
    assert len(occupancy._MEMO) == before + 1
    del snap
    gc.collect()
    assert len(occupancy._MEMO) == before
