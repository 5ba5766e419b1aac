"""How a backend sizes GPUs (Shape) and how one figure is shared over several GPUs: the pieces
the whole-card-fraction strategies, manual selection and the custom backend all use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from scheduler.cluster import GPU, Worker
from scheduler.decision import Context


@dataclass(frozen=True)
class Shape:
    """How one backend sizes GPUs: ``ratio(worker, gpu)`` is its fraction (0 = claim the estimate)."""

    ratio: Callable[[Worker, GPU], float]
    strict_multi_gpu: bool  # vLLM keeps GPUs with alloc/total > g (strict); SGLang >=
    gpu_count: int  # 0: not fixed by a world size
    enforce_count_across_workers: bool
    tp_problems: Callable[[int], list[str]]


def split(need: int, allocs: list[int]) -> list[int]:
    """Share ``need`` over GPUs in proportion to what each can give, never above it."""
    total = sum(allocs)
    shares = [need * a // total if total else 0 for a in allocs]
    rest = need - sum(shares)
    for i, a in enumerate(allocs):
        extra = min(rest, a - shares[i])
        shares[i] += extra
        rest -= extra
    return shares


def book_all(shape: Shape, ctx: Context, members: list[tuple[Worker, list[GPU]]], need: int) -> list[dict[int, int]]:
    """Bytes booked per GPU for each (worker, GPUs): the fraction of the card, or a share of the
    estimate in proportion to allocatable where the fraction is 0."""
    allocs = [ctx.allocatable[w.name].vram.get(g.index, 0) for w, gpus in members for g in gpus]
    shares = iter(split(need, allocs))
    out = []
    for w, gpus in members:
        d = {}
        for g in gpus:
            s = next(shares)
            r = shape.ratio(w, g)
            d[g.index] = int(g.vram_total * r) if r > 0 else s
        out.append(d)
    return out
