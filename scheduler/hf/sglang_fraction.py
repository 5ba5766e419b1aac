"""SGLang's default ``--mem-fraction-static`` for a GPU size, as GPUStack ports it from SGLang.

reserved MiB = 512 + max(cp, 2048) * 1.5 + bs * 2 + tp * pp / 8 * 1024, at least 10240 on
GPUs over 60 GiB; fraction = round((gpu_mib - reserved) / gpu_mib, 3).
"""

from __future__ import annotations

# (upper bound in GiB, chunked-prefill size, cuda-graph bs for tp<4, for tp>=4)
_TIERS = [(20, 2048, 8, 8), (35, 2048, 24, 80), (60, 4096, 32, 160), (90, 8192, 256, 512),
          (160, 8192, 256, 512), (float("inf"), 16384, 512, 512)]


def mem_fraction_static(gpu_mib: float | None, tp: int = 1, pp: int = 1) -> float:
    if not gpu_mib:
        return 0.88
    for bound, cp, bs_small, bs_large in _TIERS:
        if gpu_mib < bound * 1024:
            bs = bs_small if tp < 4 else bs_large
            break
    reserved = 512 + max(cp, 2048) * 1.5 + bs * 2 + tp * pp / 8 * 1024
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10240)
    return round((gpu_mib - reserved) / gpu_mib, 3)
