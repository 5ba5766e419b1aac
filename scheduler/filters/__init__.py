"""Worker filters, in GPUStack's order. Each is ``run(ctx, workers) -> FilterVerdict`` and
explains every worker it removes, with the numbers involved."""

from scheduler.filters import backend, cluster, gpu_selector, labels, local_path, status
from scheduler.filters.chain import run_chain

CHAIN = (cluster, gpu_selector, labels, status, backend, local_path)

__all__ = ["CHAIN", "run_chain"]
