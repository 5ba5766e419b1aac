"""Worker filters, in GPUStack's order. Each is ``run(ctx, workers) -> FilterVerdict`` and
explains every worker it removes, with the numbers involved. A filter with ``applies(ctx)`` runs
(and is recorded) only when that says so (cordon.py)."""

from scheduler.filters import backend, cluster, command, cordon, gather_floor, gpu_selector, labels, local_path
from scheduler.filters import pd_mode, status
from scheduler.filters.chain import run_chain

CHAIN = (cluster, gpu_selector, labels, status, cordon, backend, command, local_path)


def member_chain(spec, role, group: str | None = None) -> tuple:
    """A prefill/decode group member's chain: CHAIN, then the PD-mode filter, then, for a member
    placed after formation (``group`` given: the name its members carry), the gather floor, last,
    as in GPUStack's find_candidate. ``spec`` is the group's own spec. A deployment without roles
    never runs either: its chain is CHAIN."""
    out = (*CHAIN, pd_mode.Filter(spec, role))
    return (*out, gather_floor.Floor(spec, group)) if group is not None else out


__all__ = ["CHAIN", "member_chain", "run_chain"]
