"""GGUF placement strategies on the real SmolLM2 file and a sparse Llama-3-8B Q5_K_M."""

import pytest

from scheduler.decide import decide
from scheduler.estimate import gguf_request
from scheduler.spec import ModelSpec
from scheduler.units import GiB
from tests.conftest import cluster, gpu, worker


def spec(**kw):
    base = dict(name="llama3", source={"local_path": "/m/llama3.gguf"}, backend="llama.cpp")
    base.update(kw)
    return ModelSpec(**base)


@pytest.fixture(scope="module")
def req(llama3_gguf):
    # GPUStack's parameters: ctx 8192, 4 slots, no mmap, 150/500 MiB footprints
    return gguf_request(llama3_gguf, [])


def test_request_shape(req):
    assert req.total_layers == 33 and len(req.items) == 34
    assert req.full.vrams[0].nonuma / GiB == pytest.approx(7.29, abs=0.01)  # R1 + 250 MiB more footprint
    assert req.cpu_only.vrams[0].nonuma == 0  # CPU-only runs book no VRAM


def test_single_gpu_candidates_in_allocatable_order(req):
    # 24 GiB, 16 GiB x2 and a 6 GiB card: the 6 GiB card cannot hold 7.29 GiB; the rest are
    # candidates, ordered by allocatable (largest first, stable), and spread scores them.
    snap = cluster([worker("host4080", 62, [gpu(0, 16), gpu(1, 16)]), worker("host4090", 125, [gpu(0, 24)]),
                    worker("small", 32, [gpu(0, 6)])])
    d = decide(snap, spec(), req)
    assert d.strategy == "single_gpu"
    assert [(c.worker, c.gpu_indexes) for c in d.candidates] == [("host4090", [0]), ("host4080", [0]), ("host4080", [1])]
    c = d.candidates[0]
    assert c.claim.vram == {0: req.full.vrams[0].nonuma} and c.claim.offload_layers == 33


def test_unified_memory_worker_uses_uma_figures(req):
    snap = cluster([worker("mac", 64, [gpu(0, 48, type_="metal", vendor="apple")], unified_memory=True)])
    d = decide(snap, spec(), req)
    assert d.placement.claim.vram[0] == req.full.vrams[0].uma and d.placement.claim.is_unified_memory


def test_ram_short_worker_does_not_stop_the_scan(req):
    # GPUStack breaks out of the whole single-GPU scan at the first GPU whose worker lacks RAM.
    # "bigcard" has the largest GPU but 0.2 GiB of RAM; "ok" must still be found.
    snap = cluster([worker("bigcard", 0.2, [gpu(0, 80)]), worker("ok", 64, [gpu(0, 24)])])
    d = decide(snap, spec(), req)
    assert d.scheduled and [c.worker for c in d.candidates] == ["ok"]


def test_multi_gpu_tensor_split(req):
    # two 6 GiB cards: neither holds 7.29 GiB, together they do with a 6:6 split
    snap = cluster([worker("w", 64, [gpu(0, 6), gpu(1, 6)])])
    d = decide(snap, spec(), req)
    assert d.strategy == "multi_gpu"
    p = d.placement
    assert p.gpu_indexes == [0, 1] and p.claim.tensor_split == [6 * GiB, 6 * GiB]
    assert all(v <= 6 * GiB for v in p.claim.vram.values())


def test_rpc_across_workers(req):
    # 5 GiB + 4 GiB GPUs on two workers: only together, over RPC (distributed on)
    snap = cluster([worker("main", 64, [gpu(0, 5)]), worker("peer", 64, [gpu(0, 4)])])
    assert not decide(snap, spec(cpu_offloading=False), req).scheduled
    d = decide(snap, spec(cpu_offloading=False, distributed_inference_across_workers=True), req)
    assert d.strategy == "multi_worker"
    p = d.placement
    assert p.worker == "main" and [s.worker for s in p.subordinates] == ["peer"]
    assert p.claim.vram[0] <= 5 * GiB and p.subordinates[0].claim.vram[0] <= 4 * GiB


def test_partial_offload_then_cpu(req):
    snap = cluster([worker("w", 64, [gpu(0, 3)])])
    d = decide(snap, spec(cpu_offloading=True), req)
    assert d.strategy == "partial_offload"
    layers = d.placement.claim.offload_layers
    assert 0 < layers < 33 and req.items[layers].vrams[0].nonuma <= 3 * GiB < req.items[layers + 1].vrams[0].nonuma
    nogpu = cluster([worker("cpu", 64)])
    d = decide(nogpu, spec(cpu_offloading=True), req)
    assert d.strategy == "cpu" and d.placement.gpu_indexes == [] and d.placement.claim.ram == req.cpu_only.ram.nonuma


def test_gpu_layers_without_cpu_offloading_is_explained(llama3_gguf):
    r = gguf_request(llama3_gguf, ["--gpu-layers", "10"])
    d = decide(cluster([worker("w", 64, [gpu(0, 24)])]), spec(cpu_offloading=False, backend_parameters=["--gpu-layers", "10"]), r)
    assert not d.scheduled
    assert any("--gpu-layers 10" in x and "cpu_offloading: false" in x for x in d.reasons)


def test_smollm2_real_file_binpacks_onto_the_fuller_card(smollm2):
    # full offload needs 1.01 GiB VRAM (ctx 8192, 4 slots, 500 MiB footprint); a 1 GiB card is too
    # small; binpack prefers the 2 GiB card (1.01/2*200/3 = 33.7 + RAM term) over the 8 GiB one (8.4 + RAM term)
    r = gguf_request(smollm2, [])
    assert r.full.vrams[0].nonuma / GiB == pytest.approx(1.01, abs=0.01)
    snap = cluster([worker("big", 16, [gpu(0, 8)]), worker("tiny", 16, [gpu(0, 1)]), worker("snug", 16, [gpu(0, 2)])])
    d = decide(snap, ModelSpec(name="smol", source={"local_path": smollm2}, backend="llama.cpp", placement_strategy="binpack"), r)
    assert [c.worker for c in d.candidates] == ["big", "snug"]
    assert d.placement.worker == "snug"


def test_user_gpu_layers_are_honoured_in_partial_offload(llama3_gguf):
    r = gguf_request(llama3_gguf, ["--gpu-layers", "10"])
    d = decide(cluster([worker("w", 64, [gpu(0, 24)])]),
               spec(cpu_offloading=True, backend_parameters=["--gpu-layers", "10"]), r)
    assert d.strategy == "partial_offload" and d.placement.claim.offload_layers == 10
