"""vLLM: manual selection; one GPU; several GPUs on one worker (valid TP sizes); several workers.
Each GPU is booked at int(total * gpu_memory_utilization) (0.9 by default)."""

from __future__ import annotations

from scheduler.decision import Context
from scheduler.hf.claims import tp_problems, vllm_gmu
from scheduler.params import find_float, find_int, vllm_world_size
from scheduler.selectors.base import first_nonempty
from scheduler.selectors.fraction import Shape, strategies
from scheduler.selectors.learned import even_out, learned
from scheduler.units import gib


def world_and_tp(ctx: Context, world: int | None, msgs: list[str]) -> int | None:
    """The fixed GPU count (world size or manual count), or None after explaining a conflict."""
    sel = ctx.spec.gpu_selector
    chosen = (sel.gpus_per_replica or len(sel.gpu_ids)) if sel.gpu_ids else 0
    if world and chosen and world != chosen:
        msgs.append(f"The parallel sizes in backend_parameters need {world} GPUs, but the GPU selector gives {chosen}.")
        return None
    return world or chosen


def select(ctx: Context, workers, msgs: list[str]):
    req, spec = ctx.request, ctx.spec
    params = req.params
    gmu = vllm_gmu(spec.categories, params.architectures if params else (),
                   find_float(spec.backend_parameters, "--gpu-memory-utilization"))
    count = world_and_tp(ctx, vllm_world_size(spec.backend_parameters), msgs)
    if count is None:
        return None, []
    tp = find_int(spec.backend_parameters, "--tensor-parallel-size", "-tp", "--tp")
    if tp and params and tp_problems(params, tp):
        msgs.extend(p + " Consider adjusting your tensor-parallel-size value." for p in tp_problems(params, tp))
        return None, []
    msgs.append(f"The model requires approximately {gib(req.vram)} GiB of VRAM"
                + (f" and {gib(req.ram)} GiB of RAM." if req.ram else "."))
    if learned(req):  # a learned claim is booked, not the card's fraction (scheduler/claim_apply.py)
        gmu = 0.0
    if gmu:
        msgs.append(f"With --gpu-memory-utilization={gmu}, all GPUs combined need to provide at least "
                    f"{gib(req.vram / gmu)} GiB of total VRAM and each GPU needs {int(gmu * 100)}% of allocatable VRAM.")
    shape = Shape(ratio=lambda w, g: gmu, strict_multi_gpu=True, gpu_count=count,
                  enforce_count_across_workers=True,
                  tp_problems=(lambda n: tp_problems(params, n)) if params else (lambda n: []))
    found = first_nonempty(strategies(ctx, workers, shape), msgs)
    return even_out(ctx, found, msgs) if learned(req) else found
