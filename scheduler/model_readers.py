"""Which hosts to ask for a local model path before the estimate (the control plane may not have
the path; the GPU hosts that could run the model might): the hosts the filter chain keeps, up to
but not including the local-path filter (whose rows these reads refresh), in name order. The
request is not known yet, so no filter may depend on it."""

from __future__ import annotations

from scheduler import filters
from scheduler.allocatable import allocatable_map
from scheduler.cluster import ClusterSnapshot
from scheduler.decision import Context, FilterVerdict
from scheduler.filters import local_path
from scheduler.policy_config import PolicyConfig
from scheduler.request import FlatRequest
from scheduler.spec import ModelSpec


def reader_hosts(snapshot: ClusterSnapshot, spec: ModelSpec) -> tuple[list[str], list[FilterVerdict]]:
    """(hosts to read the path on, the verdicts that left the others out)."""
    ctx = Context(spec, snapshot, FlatRequest(vram=0), PolicyConfig(), allocatable_map(snapshot))
    chain = [f for f in filters.CHAIN if f is not local_path]
    kept, verdicts = filters.run_chain(ctx, list(snapshot.workers), chain)
    return sorted(w.name for w in kept), verdicts
