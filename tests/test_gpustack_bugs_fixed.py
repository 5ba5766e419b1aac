"""Where GPUStack is wrong, gpuflow does the right thing (gpustack-scheduler.md §4, §7, §12)."""

import pytest

from scheduler import scale_down
from scheduler.allocatable import allocatable_map
from scheduler.cluster import GPU
from scheduler.decide import decide
from scheduler.hf.config import ModelParameters
from scheduler.request import FlatRequest
from scheduler.spec import ModelSpec, PlacementStrategy
from scheduler.units import GiB
from tests.conftest import cluster, gpu, inst, worker

PARAMS = ModelParameters(num_attention_heads=32, num_kv_heads=8, head_dim=128, vocab_size=128256, num_layers=32)


def vllm(**kw):
    return ModelSpec(name="m", source={"huggingface": {"repo": "org/m"}}, backend="vllm", **kw)


def custom(**kw):
    return ModelSpec(name="m", source={"huggingface": {"repo": "org/m"}}, backend="custom", run_command="x {port}", **kw)


def test_mixed_vendor_worker_keeps_all_gpus_visible():
    # GPUStack's shallow copy leaves only the last GPU type visible on a cuda+rocm worker.
    # Here the cuda card is full and the rocm card free: vLLM must still find the rocm card.
    w = worker("mixed", 128, [gpu(0, 24, "cuda"), gpu(1, 64, "rocm", vendor="amd")])
    snap = cluster([w], [inst("busy", "other", "mixed", [0], {0: 22 * GiB})])
    d = decide(snap, vllm(), FlatRequest(vram=20 * GiB, params=PARAMS))
    assert [(c.worker, c.gpu_indexes, c.gpu_type) for c in d.candidates] == [("mixed", [1], "rocm")]
    # and with both free, both types are candidates
    d = decide(cluster([w]), vllm(), FlatRequest(vram=20 * GiB, params=PARAMS))
    assert sorted(c.gpu_type for c in d.candidates) == ["cuda", "rocm"]


def test_custom_multi_gpu_never_books_a_gpu_that_cannot_hold_its_share():
    # GPUStack: 4080x4 with GPU 3 fully claimed, a 26.99 GiB model goes on [0,1,2,3] at 6.75 GiB each,
    # overcommitting GPU 3. gpuflow takes GPUs 0,1 (2 x 13.5 GiB fits 16 GiB each). The engine
    # declares that it splits (it takes {gpu_indexes}): an engine that does not gets no multi-GPU placement.
    snap = cluster([worker("h", 64, [gpu(i, 16) for i in range(4)])], [inst("full", "other", "h", [3], {3: 16 * GiB})])
    d = decide(snap, custom().model_copy(update={"run_command": "x {port} {gpu_indexes}"}),
               FlatRequest(vram=int(26.99 * GiB), ram=2 * GiB))
    assert d.strategy == "multi_gpu" and d.placement.gpu_indexes == [0, 1]
    assert 3 not in d.placement.claim.vram
    assert all(v <= 16 * GiB for v in d.placement.claim.vram.values())


def test_memory_used_outside_gpuflow_is_not_available():
    # GPU 0 reports 20 GiB used while gpuflow's claims on it total 0: a foreign process holds it.
    snap = cluster([worker("h", 64, [gpu(0, 24, used=20), gpu(1, 24)])])
    d = decide(snap, custom(), FlatRequest(vram=10 * GiB, ram=1 * GiB))
    assert [c.gpu_indexes for c in d.candidates] == [[1]]
    # used memory our own claim explains is not counted twice: claimed 8, used 8 -> 16 left
    snap = cluster([worker("h", 64, [gpu(0, 24, used=8)])], [inst("ours", "other", "h", [0], {0: 8 * GiB})])
    assert decide(snap, custom(), FlatRequest(vram=16 * GiB, ram=1 * GiB)).scheduled


@pytest.mark.parametrize("total,claimed,used,foreign,left", [
    (24, 0, None, None, 24),  # nothing observed: claims only
    (24, 8, 3, None, 16),     # our 8 GiB claim, its process has only 3 GiB so far: 24 - max(8, 3) = 16
    (24, 8, 13, 10, 6),       # + 10 GiB foreign: 24 - max(8 + 10, 13) = 6 (used alone would leave 11)
    (24, 8, 20, 2, 4),        # our process grew past its claim: 24 - max(8 + 2, 20) = 4
    (24, 0, 30, 30, 0),       # someone holds more than the card: never negative
])
def test_foreign_memory_counts_on_top_of_claims(total, claimed, used, foreign, left):
    g = GPU(index=0, vram_total=total * GiB, vram_used=None if used is None else used * GiB,
            vram_foreign=None if foreign is None else foreign * GiB)
    w = worker("h", 64, [g])
    claims = [inst("ours", "m", "h", [0], {0: claimed * GiB})] if claimed else []
    assert allocatable_map(cluster([w], claims))["h"].vram == {0: left * GiB}


def test_scale_down_placement_sees_other_models():
    # two instances of m, one per worker; worker w1 also runs 3 instances of other models.
    # Spread in removal mode must see them: the instance on crowded w1 scores lower and goes first.
    # w1: cur 1, oth 3; w2: cur 1, oth 0 (stats over all workers)
    #   w1: 0.50 + 0.25*1 + 0.15*inv(3,0,3)=0 -> 0.75; gpu 1/(1+1+0.6) = 0.385 -> 0.85*75 + 0.15*38.5 = 69.5
    #   w2: 0.50 + 0.25 + 0.15 = 0.90; gpu 1/(1+1) = 0.5 -> 0.85*90 + 0.15*50 = 84.0
    snap = cluster([worker("w1", 64, [gpu(0, 80)]), worker("w2", 64, [gpu(0, 80)])],
                   [inst("m-1", "m", "w1", [0], {0: GiB}), inst("m-2", "m", "w2", [0], {0: GiB})]
                   + [inst(f"o{i}", f"other{i}", "w1", [0], {0: GiB}) for i in range(3)])
    ranked = scale_down.rank(snap, "m", PlacementStrategy.SPREAD)
    assert [r.instance.name for r in ranked] == ["m-1", "m-2"]
    assert round(ranked[0].scores["placement"], 3) == 0.695 and round(ranked[1].scores["placement"], 3) == 0.84


def test_manual_selection_never_overcommits():
    snap = cluster([worker("h", 64, [gpu(0, 24), gpu(1, 24)])], [inst("x", "other", "h", [1], {1: 20 * GiB})])
    spec = vllm(gpu_selector={"gpu_ids": ["h:cuda:0", "h:cuda:1"]})
    d = decide(snap, spec, FlatRequest(vram=30 * GiB, params=PARAMS))
    assert not d.scheduled
    assert any("h:cuda:1 has 4.0 GiB allocatable (17%)" in r for r in d.reasons)


def test_rescheduled_instance_does_not_compete_with_its_own_claim():
    snap = cluster([worker("h", 64, [gpu(0, 24)])], [inst("me", "m", "h", [0], {0: 20 * GiB})])
    assert not decide(snap, custom(), FlatRequest(vram=20 * GiB, ram=GiB)).scheduled
    assert decide(snap, custom(), FlatRequest(vram=20 * GiB, ram=GiB), exclude="me").scheduled


def test_subordinate_ram_is_counted_on_its_worker():
    snap = cluster([worker("sub", 16, [gpu(0, 24)])],
                   [inst("d", "other", "main", [0], {0: GiB}, subordinates=[{"worker": "sub", "gpu_indexes": [0],
                                                                               "claim": {"ram": 15 * GiB, "vram": {0: GiB}}}])])
    d = decide(snap, custom(), FlatRequest(vram=GiB, ram=2 * GiB))
    assert not d.scheduled
