"""Worker filters, in GPUStack's order. Each is ``run(ctx, workers) -> FilterVerdict`` and
explains every worker it removes, with the numbers involved. A filter with ``applies(ctx)`` runs
(and is recorded) only when that says so (cordon.py)."""

from scheduler.filters import backend, cluster, command, cordon, gpu_selector, labels, local_path, status
from scheduler.filters.chain import run_chain

CHAIN = (cluster, gpu_selector, labels, status, cordon, backend, command, local_path)

__all__ = ["CHAIN", "run_chain"]
