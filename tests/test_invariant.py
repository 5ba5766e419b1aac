"""Property: no decision books more than allocatable VRAM on any GPU or RAM on any worker
(subordinates included), whatever the cluster, claims, backend or strategy."""

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from scheduler.allocatable import allocatable_map
from scheduler.decide import decide
from scheduler.estimate import gguf_request
from scheduler.hf.config import ModelParameters
from scheduler.request import FlatRequest
from scheduler.spec import ModelSpec
from scheduler.units import GiB
from tests.conftest import cluster, gpu, inst, worker

PARAMS = ModelParameters(num_attention_heads=32, num_kv_heads=8, head_dim=128, vocab_size=128256, num_layers=32)


@st.composite
def clusters(draw):
    workers, instances = [], []
    for w in range(draw(st.integers(1, 5))):
        n = draw(st.integers(0, 4))
        gpus = [gpu(i, draw(st.sampled_from([4, 8, 16, 24, 48, 80])), used=draw(st.one_of(st.none(), st.integers(0, 30))))
                for i in range(n)]
        workers.append(worker(f"w{w}", draw(st.integers(1, 256)), gpus, unified_memory=draw(st.booleans()) and n == 1,
                              reserved={"ram": draw(st.integers(0, 4)) * GiB, "vram": draw(st.integers(0, 2)) * GiB}))
        for i in range(n):
            if draw(st.booleans()):
                instances.append(inst(f"i{w}-{i}", draw(st.sampled_from(["m", "other"])), f"w{w}", [i],
                                      {i: draw(st.integers(0, 30)) * GiB}, ram=draw(st.integers(0, 8)) * GiB))
    return cluster(workers, instances)


def _check(snap, d):
    if not d.scheduled:
        return
    alloc = allocatable_map(snap)
    for c in d.candidates:
        parts = [(c.worker, c.claim)] + [(s.worker, s.claim) for s in c.subordinates]
        for w, claim in parts:
            for idx, b in claim.vram.items():
                assert b <= alloc[w].vram[idx], (w, idx, b, alloc[w].vram[idx], d.strategy)
            assert claim.ram <= alloc[w].ram, (w, claim.ram, alloc[w].ram, d.strategy)
            if claim.is_unified_memory:
                assert claim.ram + sum(claim.vram.values()) <= alloc[w].ram + max(alloc[w].vram.values(), default=0)


SPECS = {
    "custom": ModelSpec(name="m", source={"huggingface": {"repo": "o/m"}}, backend="custom", run_command="x",
                        cpu_offloading=True),
    "vllm": ModelSpec(name="m", source={"huggingface": {"repo": "o/m"}}, backend="vllm"),
    "sglang": ModelSpec(name="m", source={"huggingface": {"repo": "o/m"}}, backend="sglang"),
}


@settings(max_examples=150, deadline=None)
@given(snap=clusters(), backend=st.sampled_from(sorted(SPECS)), vram=st.integers(0, 200), ram=st.integers(0, 64),
       binpack=st.booleans())
def test_flat_backends_never_overbook(snap, backend, vram, ram, binpack):
    spec = SPECS[backend].model_copy(update={"placement_strategy": "binpack" if binpack else "spread"})
    d = decide(snap, spec, FlatRequest(vram=vram * GiB, ram=ram * GiB, params=PARAMS))
    _check(snap, d)


@pytest.fixture(scope="module", params=["smollm2", "llama3_gguf"])
def gguf(request):
    path = request.getfixturevalue(request.param)
    return path, gguf_request(path, [])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(snap=clusters(), cpu_off=st.booleans(), dist=st.booleans())
def test_gguf_never_overbooks(gguf, snap, cpu_off, dist):
    # SmolLM2 (1 GiB) mostly fits one GPU; Llama-3-8B (7.3 GiB) exercises multi-GPU, RPC, partial, CPU
    path, req = gguf
    spec = ModelSpec(name="m", source={"local_path": path}, backend="llama.cpp", cpu_offloading=cpu_off,
                     distributed_inference_across_workers=dist)
    _check(snap, decide(snap, spec, req))
