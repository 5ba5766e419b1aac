"""Keep workers that can run the backend: one of its GPU types, or the CPU where the backend
runs there and the worker has no GPU or the model allows CPU offloading. A worker's own
``backends`` list (what its agent found it can launch: worker_agent/capabilities.py), when
given, restricts further; None means unknown and keeps the worker, as in GPUStack."""

from scheduler.filters.chain import verdict
from scheduler.spec import Backend

NAME = "backend"

GPU_TYPES = {
    Backend.VLLM: {"cuda", "rocm"},
    Backend.SGLANG: {"cuda", "rocm"},
    Backend.LLAMA_CPP: {"cuda", "rocm", "metal", "mps", "vulkan", "musa", "cann", "sycl"},
    Backend.VOXBOX: {"cuda"},
    Backend.CUSTOM: None,  # any
}
MISSING = {Backend.VLLM: "no vllm executable found", Backend.SGLANG: "no Python with sglang found",
           Backend.LLAMA_CPP: "no llama-server or llama-cpp-python found",
           Backend.VOXBOX: "voxbox has no launcher on gpuflow agents",
           Backend.CUSTOM: "custom run commands need gpuflow agent --allow-custom"}
RUNS_ON_CPU = {Backend.VLLM: False, Backend.SGLANG: False, Backend.LLAMA_CPP: True,
               Backend.VOXBOX: True, Backend.CUSTOM: True}


def _reasons(spec, w) -> list[str]:
    b = spec.backend
    if w.backends is not None and b.value not in w.backends:
        return [f"cannot run {b.value}: {MISSING[b]} (it runs: {', '.join(w.backends) or 'none'})"]
    allowed = GPU_TYPES[b]
    types = sorted({g.type for g in w.gpus})
    if allowed is None and w.gpus:
        return []
    if allowed is not None and set(types) & allowed:
        return []
    if RUNS_ON_CPU[b] and (not w.gpus or spec.offloads_to_cpu):
        return []
    if not w.gpus:
        return [f"worker has no GPU and {b.value} does not run on CPU"]
    why = f"worker's GPU types {types} are not among {b.value}'s ({', '.join(sorted(allowed))})" if allowed else ""
    if RUNS_ON_CPU[b]:
        why += "; CPU would do, but cpu_offloading is off"
    return [why]


def run(ctx, workers):
    removed = {}
    for w in workers:
        r = _reasons(ctx.spec, w)
        if r:
            removed[w.name] = r
    return verdict(NAME, workers, removed)
