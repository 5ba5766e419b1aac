"""Placement rules where gpuflow follows GPUStack 2.3.0 (issue 15's parity list). GPUStack's
behaviour is the expected value; deliberate differences are in docs/gpustack-differences.md."""

import pytest

from scheduler.decide import decide
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
