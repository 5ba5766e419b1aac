"""GGUF models: which strategies run, in GPUStack's order and with its skip rules, then the
first that yields any candidate wins."""

from __future__ import annotations

from scheduler.decision import Context
from scheduler.selectors import gguf_partial, gguf_rpc, gguf_strategies as S
from scheduler.selectors.base import first_nonempty
from scheduler.units import gib

ORDER = ("single_gpu", "multi_gpu", "multi_worker", "partial_offload", "cpu")


def allowed(ctx: Context, workers, msgs: list[str]) -> set[str]:
    spec, req = ctx.spec, ctx.request
    ok = set(ORDER)
    if not spec.offloads_to_cpu:
        ok -= {"partial_offload", "cpu"}
    if not spec.distributed:
        ok.discard("multi_worker")
    ngl, total = req.gpu_layers, req.total_layers
    if ngl is not None:
        if 0 < ngl < total and not spec.offloads_to_cpu:
            msgs.append(f"The parameter --gpu-layers {ngl} offloads part of the model ({total} layers); "
                        "it requires CPU offloading, which this model turns off (cpu_offloading: false).")
            return set()
        if ngl == 0:
            ok = {"cpu"}
        else:
            ok.discard("cpu")
            if ngl != total:
                ok -= {"single_gpu", "multi_gpu"}
            else:
                ok -= {"partial_offload", "cpu"}
    if req.user_tensor_split:
        ok.discard("single_gpu")
    sel = spec.gpu_selector.by_worker()
    if sel:
        ok.discard("cpu")
        if len(sel) > 1:
            ok &= {"multi_worker"}
        elif len(next(iter(sel.values()))) > 1:
            ok -= {"single_gpu", "multi_worker"}
        else:
            ok -= {"multi_gpu", "multi_worker"}
    if not any(a.vram_total for a in (ctx.allocatable[w.name] for w in workers)):
        ok &= {"cpu"}
        if any(w.gpus for w in workers):
            msgs.append("No GPU has allocatable VRAM left.")
        if not ok:
            msgs.append(_no_cpu_run(ctx, workers, bool(sel)))
    return ok


def _no_cpu_run(ctx: Context, workers, selected: bool) -> str:
    """Why nothing can run: no worker left has VRAM to offload to, and the CPU-only run is off."""
    seen = "; ".join(f"{w.name}: " + (f"{len(w.gpus)} GPU(s), {gib(ctx.allocatable[w.name].vram_total)} GiB allocatable"
                                      if w.gpus else "no GPU") for w in workers)
    why = ("cpu_offloading is off" if not ctx.spec.offloads_to_cpu else "gpu_selector asks for GPUs" if selected
           else f"--gpu-layers {ctx.request.gpu_layers} asks for GPUs")
    return f"No GPU to offload layers to ({seen}), and a CPU-only run is not allowed: {why}."


def restrict_to_selected(ctx: Context, workers):
    """Manual selection: each worker keeps only its selected GPUs."""
    sel = ctx.spec.gpu_selector.by_worker()
    if not sel:
        return workers
    return [w.model_copy(update={"gpus": [g for g in w.gpus if g.index in {x.index for x in sel.get(w.name, [])}]})
            for w in workers]


def select(ctx: Context, workers, msgs: list[str]):
    req = ctx.request
    full = req.full
    msgs.append(f"The model needs {gib(full.vrams[0].nonuma)} GiB of VRAM and {gib(full.ram.nonuma)} GiB of RAM "
                f"to offload all {req.total_layers} layers to one GPU (context {req.options.ctx_size}).")
    workers = restrict_to_selected(ctx, workers)
    # GPUStack's orders: GPU lists (one GPU, RPC) start from the filtered order; the per-worker
    # strategies walk workers by allocatable VRAM, largest first (stable)
    by_vram = sorted(workers, key=lambda w: -ctx.allocatable[w.name].vram_total)
    ok = allowed(ctx, workers, msgs)
    runs = {
        "single_gpu": lambda m: S.single_gpu(ctx, workers, m),
        "multi_gpu": lambda m: S.multi_gpu(ctx, by_vram, m),
        "multi_worker": lambda m: gguf_rpc.rpc(ctx, workers, m, ctx.spec.offloads_to_cpu),
        "partial_offload": lambda m: gguf_partial.partial(ctx, by_vram, m),
        "cpu": lambda m: S.cpu(ctx, by_vram, m),
    }
    return first_nonempty([(name, runs[name]) for name in ORDER if name in ok], msgs)
