"""Scale-down offloaded layers: offload_layers/total_layers*100 (GGUF); 0 when unknown."""

from scheduler.cluster import Claim


def score(c: Claim) -> float:
    if c.offload_layers is None or not c.total_layers:
        return 0.0
    return min(c.offload_layers / c.total_layers, 1.0) * 100
