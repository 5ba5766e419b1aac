"""Placement rules where gpuflow follows GPUStack 2.3.0 (issue 15's parity list). GPUStack's
behaviour is the expected value; deliberate differences are in docs/gpustack-differences.md."""

import pytest

from scheduler.decide import decide
from scheduler.estimate import gguf_request
from scheduler.request import FlatRequest
from scheduler.spec import ModelSpec
from scheduler.units import GiB
from tests.conftest import cluster, gpu, worker


def custom(**kw):
    return ModelSpec(name="m", source={"huggingface": {"repo": "org/m"}}, backend="custom", run_command="x {port}", **kw)


@pytest.mark.parametrize("workers,walk,placed", [
    # a (cuda 8 GiB: too small for 10 GiB), b (rocm 24), c (cuda 24). GPUStack groups workers by GPU
    # type, types in order of first appearance: cuda [a, c], then rocm [b]. Candidates c, b; fresh
    # cluster, spread gives both the same score, so the first (c) wins; snapshot order would pick b.
    ([worker("a", 64, [gpu(0, 8)]), worker("b", 64, [gpu(0, 24, "rocm", "amd")]), worker("c", 64, [gpu(0, 24)])],
     [("c", "cuda"), ("b", "rocm")], "c"),
    # a worker with both types appears once per type: x's rocm card opens the walk (rocm is the
    # first type seen), then the cuda group in worker order: x's cuda card, y's
    ([worker("x", 64, [gpu(0, 24, "rocm", "amd"), gpu(1, 24)]), worker("y", 64, [gpu(0, 24)])],
     [("x", "rocm"), ("x", "cuda"), ("y", "cuda")], "x"),
])
def test_custom_single_gpu_walks_workers_by_gpu_type(workers, walk, placed):
    d = decide(cluster(workers), custom(), FlatRequest(vram=10 * GiB, ram=GiB))
    assert d.strategy == "single_gpu"
    assert [(c.worker, c.gpu_type) for c in d.candidates] == walk
    assert d.placement.worker == placed


# ---- GGUF over RPC (Llama-3-8B Q5_K_M, GPUStack's parameters: full offload 7.28 GiB NonUMA,
# 6.25 GiB UMA on one GPU; one layer 1.28 GiB NonUMA) ----

def gguf(**kw):
    base = dict(name="l3", source={"local_path": "/m/l3.gguf"}, backend="llama.cpp",
                distributed_inference_across_workers=True)
    base.update(kw)
    return ModelSpec(**base)


@pytest.fixture(scope="module")
def l3(llama3_gguf):
    return gguf_request(llama3_gguf, [])


def test_rpc_main_gpus_enter_the_split_largest_first(l3):
    # main: GPU 0 2 GiB, GPU 1 4 GiB (sum 6 > peer's 4, so it is the main worker); peer: 4 GiB.
    # Nothing holds 7.28 GiB; with cpu_offloading the RPC path keeps the most layers.
    # GPUStack's split: [rpc 4, main largest first 4, 2] -> 29 layers; by index [4, 2, 4] -> 28.
    snap = cluster([worker("main", 64, [gpu(0, 2), gpu(1, 4)]), worker("peer", 64, [gpu(0, 4)])])
    d = decide(snap, gguf(cpu_offloading=True), l3)
    p = d.placement
    assert d.strategy == "multi_worker" and p.gpu_indexes == [1, 0]
    assert p.claim.tensor_split == [4 * GiB, 4 * GiB, 2 * GiB] and p.claim.offload_layers == 29
    by_index = l3.run((4 * GiB, 2 * GiB, 4 * GiB), ("peer:1",), gpu_layers=29)
    # the index order cannot hold those 29 layers: some GPU would need more than it has
    assert any(v.nonuma > a for v, a in zip(by_index.vrams, (4 * GiB, 2 * GiB, 4 * GiB)))
    item = l3.run((4 * GiB, 4 * GiB, 2 * GiB), ("peer:1",), gpu_layers=29)
    assert p.claim.vram == {1: item.vrams[1].nonuma, 0: item.vrams[2].nonuma}
    assert p.subordinates[0].claim.vram == {0: item.vrams[0].nonuma}


@pytest.mark.parametrize("strategy,rpc_worker", [
    # main 6 GiB; p1 5 GiB, p2 4 GiB. One server suffices, and both p1 and p2 give full offload:
    # split [5, 6] books p1 3.65 GiB, split [4, 6] books p2 3.48 GiB. GPUStack scores both
    # (the bounded search tried only p1, the largest).
    ("spread", "p1"),   # fresh cluster: equal spread scores, the first combination wins
    ("binpack", "p2"),  # the fuller RPC GPU: p2 3.48/4 -> 58.0 against p1 3.65/5 -> 48.7 (x 200/3, RAM 0)
])
def test_rpc_scores_every_combination(l3, strategy, rpc_worker):
    snap = cluster([worker("main", 64, [gpu(0, 6)]), worker("p1", 64, [gpu(0, 5)]), worker("p2", 64, [gpu(0, 4)])])
    d = decide(snap, gguf(placement_strategy=strategy), l3)
    assert d.strategy == "multi_worker"
    assert [c.subordinates[0].worker for c in d.candidates] == ["p1", "p2"]
    assert all(c.claim.offload_layers == 33 for c in d.candidates)
    assert d.placement.subordinates[0].worker == rpc_worker


def test_rpc_tries_every_combination_of_k_servers(l3):
    # main 4 GiB; p1, p2, p3 3 GiB each. k = 1: 3 + 4 = 7 GiB < 7.28 (the one-GPU figure, a floor
    # for any split): skipped without an estimate. k = 2: every pair gives the split [3, 3, 4] and
    # full offload, so all three pairs are candidates (the bounded search kept only p1+p2).
    snap = cluster([worker("main", 64, [gpu(0, 4)])] + [worker(f"p{i}", 64, [gpu(0, 3)]) for i in (1, 2, 3)])
    d = decide(snap, gguf(), l3)
    assert d.strategy == "multi_worker"
    assert [tuple(s.worker for s in c.subordinates) for c in d.candidates] == [("p1", "p2"), ("p1", "p3"), ("p2", "p3")]
    assert all(c.claim.offload_layers == 33 and c.claim.tensor_split == [3 * GiB, 3 * GiB, 4 * GiB] for c in d.candidates)


@pytest.mark.parametrize("main_uma,peer_uma", [(True, False), (False, True), (True, True)])
def test_rpc_books_each_workers_memory_kind(l3, main_uma, peer_uma):
    # main 4.5 GiB, peer 4 GiB. Split [4, 4.5] GiB, full offload: each GPU books the figure of
    # its worker's kind (UMA: weights + KV + footprint; NonUMA adds compute buffers and 500 MiB).
    def w(name, g, uma):
        return worker(name, 64, [gpu(0, g, type_="metal", vendor="apple") if uma else gpu(0, g)], unified_memory=uma)
    snap = cluster([w("main", 4.5, main_uma), w("peer", 4, peer_uma)])
    d = decide(snap, gguf(), l3)
    assert d.strategy == "multi_worker"
    p = d.placement
    item = l3.run((4 * GiB, int(4.5 * GiB)), ("peer:1",), gpu_layers=-1)
    kind = (lambda m, uma: m.uma if uma else m.nonuma)
    assert p.claim.vram == {0: kind(item.vrams[1], main_uma)} and p.claim.is_unified_memory == main_uma
    assert p.claim.ram == kind(item.ram, main_uma)
    s = p.subordinates[0]
    assert s.claim.vram == {0: kind(item.vrams[0], peer_uma)} and s.claim.is_unified_memory == peer_uma


@pytest.mark.parametrize("gpus,placed,layers", [
    # one 2 GiB GPU holds 5 layers (1.99 GiB; 6 need 2.16). Three share 12, 4 each (1.86, 1.84,
    # 1.85 GiB: each GPU repeats its own buffers); 13 would give GPU 0 a fifth (2.03 GiB > 2).
    ([2, 2, 2], [0, 1, 2], 12),
    # four: 16, 4 each; 17 puts 5 on GPU 0 (2.04 GiB). More GPUs are tried while the count grows.
    ([2, 2, 2, 2], [0, 1, 2, 3], 16),
    # the 3 GiB GPU alone holds 10; no pair does better, so one GPU stays the answer
    ([3, 1.5, 1.5, 1.5], [0], 10),
])
def test_partial_offload_across_several_gpus_of_one_worker(l3, gpus, placed, layers):
    d = decide(cluster([worker("w", 64, [gpu(i, g) for i, g in enumerate(gpus)])]), gguf(cpu_offloading=True), l3)
    assert d.strategy == "partial_offload"
    p = d.placement
    assert (p.gpu_indexes, p.claim.offload_layers) == (placed, layers)
    if len(placed) > 1:
        assert p.claim.tensor_split == [int(g * GiB) for g in gpus][:len(placed)]
        item = l3.run(tuple(p.claim.tensor_split), gpu_layers=layers)
        assert p.claim.vram == {i: item.vrams[i].nonuma for i in placed} and p.claim.ram == item.ram.nonuma


# ---- CPU offloading: GPUStack's default for GGUF models on llama.cpp (llama-box) is on ----

@pytest.mark.parametrize("cpu_offloading,strategy,decisive", [
    # SmolLM2 on a host with 16 GiB RAM and no GPU: the CPU run needs 0.2 GiB of RAM
    (None, "cpu", None),   # not said: on for llama.cpp, so the CPU runs it
    (True, "cpu", None),
    (False, None, "No GPU to offload layers to (laptop: no GPU), and a CPU-only run is not allowed: "
                  "cpu_offloading is off."),
])
def test_cpu_only_host_runs_gguf_unless_the_spec_says_no(smollm2, cpu_offloading, strategy, decisive):
    r = gguf_request(smollm2, [])
    spec = ModelSpec(name="smol", source={"local_path": smollm2}, backend="llama.cpp", cpu_offloading=cpu_offloading)
    d = decide(cluster([worker("laptop", 16, labels={"gpuflow.dev/host": "laptop"})]), spec, r)
    assert d.strategy == strategy
    if strategy:
        assert d.placement.gpu_indexes == [] and d.placement.claim.ram == r.cpu_only.ram.nonuma
        assert d.placement.claim.offload_layers == 0
    else:
        assert decisive in d.reasons and not any("label" in x for x in d.reasons)


def test_gpu_host_short_of_vram_offloads_part_by_default(l3):
    # Llama-3-8B needs 7.28 GiB on one GPU; a 3 GiB card takes part of it when the spec is silent
    d = decide(cluster([worker("w", 64, [gpu(0, 3)])]), gguf(distributed_inference_across_workers=None), l3)
    assert d.strategy == "partial_offload" and 0 < d.placement.claim.offload_layers < 33
    d = decide(cluster([worker("w", 64, [gpu(0, 3)])]), gguf(cpu_offloading=False), l3)
    assert not d.scheduled


def test_other_backends_keep_cpu_offloading_off():
    spec = custom()
    assert spec.cpu_offloading is None and not spec.offloads_to_cpu
    d = decide(cluster([worker("cpu", 64)]), spec, FlatRequest(vram=GiB, ram=GiB))
    assert not d.scheduled
    assert "cpu: Workers without a GPU (cpu) could run it on the CPU, but cpu_offloading is off." in d.reasons



def test_gguf_per_worker_strategies_walk_workers_by_allocatable_vram(l3):
    # neither worker has a 7.28 GiB GPU; both hold the model on two GPUs. GPUStack walks workers by
    # allocatable VRAM (b: 2 x 6 = 12 GiB before a: 2 x 5 = 10 GiB), so b's candidate comes first
    # and wins the tie on a fresh cluster (snapshot order would pick a)
    snap = cluster([worker("a", 64, [gpu(0, 5), gpu(1, 5)]), worker("b", 64, [gpu(0, 6), gpu(1, 6)])])
    d = decide(snap, gguf(), l3)
    assert d.strategy == "multi_gpu"
    assert [c.worker for c in d.candidates] == ["b", "a"] and d.placement.worker == "b"
