"""Binpack: prefer the placement that leaves its GPUs (and RAM) fullest.

Per GPU i: (ram_claim/ram_alloc * 1 + vram_claim_i/vram_alloc_i * 2) / 3 * 100 (VRAM weighs twice
RAM; a term is 0 when its claim is 0), the maximum over the candidate's GPUs; CPU-only:
ram_claim/ram_alloc * 100. Allocatable is measured before the placement. In removal mode
(scale-down) the instance's own claim is added back to allocatable. Subordinates count as the
mean of their own scores with weight 1 each against 5 for the main (GPUStack sums them, then
multiplies by their number again; we take the mean).
"""

from __future__ import annotations

from scheduler.allocatable import Allocatable
from scheduler.cluster import Claim


def item_score(gpu_indexes: list[int], c: Claim, a: Allocatable, removal: bool = False) -> float:
    ram_a = a.ram + (c.ram if removal else 0)
    if not gpu_indexes:
        return min(c.ram / ram_a * 100, 100.0) if ram_a and c.ram else 0.0
    best = 0.0
    for i in gpu_indexes:
        v_c = c.vram.get(i, 0)
        best = max(best, _gpu(c.ram, ram_a, v_c, a.vram.get(i, 0) + (v_c if removal else 0)))
    return best


def _gpu(ram_c: int, ram_a: int, v_c: int, v_a: int) -> float:
    ram = ram_c / ram_a * 100 if ram_c and ram_a else 0.0
    vram = v_c / v_a * 100 * 2 if v_c and v_a else 0.0
    return min((ram + vram) / 3, 100.0)


def one_gpu(worker: str, index: int, vram_c: int, ram_c: int, alloc: dict[str, Allocatable]) -> float:
    """``score`` for a claim of ``vram_c`` bytes on one GPU and ``ram_c`` of RAM, no subordinates."""
    a = alloc.get(worker)
    return max(0.0, _gpu(ram_c, a.ram, vram_c, a.vram.get(index, 0))) if a is not None else 0.0


def score(worker: str, gpu_indexes, c: Claim, subordinates, alloc: dict[str, Allocatable], removal=False) -> float:
    s = item_score(gpu_indexes, c, alloc[worker], removal) if worker in alloc else 0.0
    if subordinates:
        subs = [item_score(sw.gpu_indexes, sw.claim, alloc[sw.worker], removal) if sw.worker in alloc else 0.0
                for sw in subordinates]
        s = (s * 5 + sum(subs)) / (5 + len(subs))
    return s
