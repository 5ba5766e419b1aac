"""SGLang: like vLLM, but each GPU type gets SGLang's own --mem-fraction-static for its size."""

from __future__ import annotations

from scheduler.decision import Context
from scheduler.hf.claims import tp_problems
from scheduler.hf.sglang_fraction import mem_fraction_static
from scheduler.params import find_float, sglang_world_size
from scheduler.selectors.base import first_nonempty
from scheduler.selectors.fraction import Shape, strategies
from scheduler.selectors.learned import even_out, learned
from scheduler.selectors.vllm import world_and_tp
from scheduler.units import MiB, gib


def fractions(workers, explicit: float | None, tp: int) -> dict[str, float]:
    """GPU type -> fraction, sized by the smallest card of that type among the workers."""
    smallest: dict[str, int] = {}
    for w in workers:
        for g in w.gpus:
            smallest[g.type] = min(smallest.get(g.type, g.vram_total), g.vram_total)
    return {t: explicit or mem_fraction_static(v / MiB, tp) for t, v in smallest.items()}


def select(ctx: Context, workers, msgs: list[str]):
    req, spec = ctx.request, ctx.spec
    params = req.params
    count = world_and_tp(ctx, sglang_world_size(spec.backend_parameters), msgs)
    if count is None:
        return None, []
    frac = fractions(workers, find_float(spec.backend_parameters, "--mem-fraction-static"), count or 1)
    msgs.append(f"The model requires approximately {gib(req.vram)} GiB of VRAM; --mem-fraction-static by GPU type: "
                + ", ".join(f"{t} {f}" for t, f in frac.items()) + ".")
    if learned(req):  # a learned claim is booked, not the card's fraction (scheduler/claim_apply.py)
        frac = {t: 0.0 for t in frac}
    shape = Shape(ratio=lambda w, g: frac[g.type], strict_multi_gpu=False, gpu_count=count,
                  enforce_count_across_workers=False,
                  tp_problems=(lambda n: tp_problems(params, n)) if params else (lambda n: []))
    found = first_nonempty(strategies(ctx, workers, shape), msgs)
    return even_out(ctx, found, msgs) if learned(req) else found
