"""How many layers each GPU of a tensor split takes, without running the estimate: the searches
use it to skip combinations that cannot hold their share (tests/test_gguf_search_bounds.py checks
it against ``estimate._place_layers``, whose arithmetic it repeats)."""

from __future__ import annotations

import math


def layers_per_device(n_layer: int, tensor_split: tuple[float, ...], gpu_layers: int) -> list[int]:
    """How many layers each GPU of ``tensor_split`` takes, as ``_place_layers`` assigns them, in
    O(devices) instead of O(layers): layer j of the offloaded ones goes to the first GPU whose
    cumulative fraction exceeds j / n_actual, with the same float arithmetic."""
    n_off = n_layer if gpu_layers < 0 else min(gpu_layers, n_layer)
    n_actual = n_off + (1 if gpu_layers < 0 or gpu_layers > n_layer else 0)
    total, acc, below = sum(tensor_split), 0.0, []
    for v in tensor_split[:-1]:
        acc += v
        frac = acc / total
        c = min(n_off, max(0, math.ceil(frac * n_actual)))  # offloaded layers j with j / n_actual < frac
        while c > 0 and (c - 1) / n_actual >= frac:
            c -= 1
        while c < n_off and c / n_actual < frac:
            c += 1
        below.append(c)
    bounds = [0] + below + [n_off]
    return [max(0, bounds[i + 1] - max(bounds[:i + 1])) for i in range(len(tensor_split))]
