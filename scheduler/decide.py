"""The decision: filter, select, score, pick. Snapshot and request in, decision out."""

from __future__ import annotations

from scheduler import filters, foreign, occupancy, reasons, selectors, topology_policy
from scheduler.candidates import GpuRows
from scheduler.cluster import ClusterSnapshot
from scheduler.decision import Candidate, Context, Decision
from scheduler.policy_config import PolicyConfig
from scheduler.request import Request
from scheduler.scorers import apply_chain, binpack, locality, pick, spread
from scheduler.scorers import fragmentation, topology
from scheduler.spec import ModelSpec, PlacementStrategy


def _placement(ctx: Context, cands: list[Candidate]) -> list[float]:
    if ctx.spec.placement_strategy == PlacementStrategy.BINPACK:
        if isinstance(cands, GpuRows):
            return [binpack.one_gpu(w, i, b, r, ctx.allocatable)
                    for w, i, b, r in zip(cands.workers, cands.indexes, cands.books, cands.rams)]
        return [binpack.score(c.worker, c.gpu_indexes, c.claim, c.subordinates, ctx.allocatable) for c in cands]
    counts = ctx.occupancy.spread_counts(ctx.spec.name)
    if isinstance(cands, GpuRows):
        return spread.one_gpu(cands.workers, cands.indexes, counts)
    return spread.scores([(c.worker, c.gpu_indexes) for c in cands], counts, [c.worker for c in cands])


def _locality(ctx: Context, cands: list[Candidate]) -> list[float]:
    files = ctx.snapshot.model_files
    main = locality.ready_on(files, ctx.spec.source.key)
    draft = locality.ready_on(files, ctx.spec.draft_model.key if ctx.spec.draft_model else None)
    if not main and not draft:
        return [0.0] * len(cands)  # what score gives every candidate when no worker holds the files
    if isinstance(cands, GpuRows):
        return [locality.score([w], main, draft) for w in cands.workers]
    return [locality.score(c.workers, main, draft) for c in cands]


def _topology(ctx: Context, cands: list[Candidate]) -> list[float]:
    if isinstance(cands, GpuRows):
        return [100.0] * len(cands)  # one GPU has nothing to join and loses nothing
    return topology.scores(ctx.snapshot, cands)


def scale_up_chain(ctx: Context, fragmented: list[bool] | None = None):
    """``fragmented``: each candidate's flag (scorers/fragmentation.py); the scorer runs only
    when the candidates mix whole and fragmented placements."""
    chain = [("placement", ctx.config.placement, lambda cs: _placement(ctx, cs)),
             ("locality", ctx.config.locality, lambda cs: _locality(ctx, cs))]
    if ctx.occupancy.topology:
        chain.append(("topology", ctx.config.topology, lambda cs: _topology(ctx, cs)))
    if fragmented and any(fragmented) and not all(fragmented):
        chain.append(("fragmentation", ctx.config.fragmentation, lambda cs: fragmentation.scores(fragmented)))
    return chain


def decide(snapshot: ClusterSnapshot, spec: ModelSpec, request: Request,
           config: PolicyConfig | None = None, exclude: str | None = None, whole_only: bool = False,
           chain: tuple | None = None) -> Decision:
    """Where one replica of ``spec`` goes on ``snapshot``, and why. ``exclude`` names an
    instance being re-placed, whose own claim and counts are left out. ``whole_only``: no
    placement in slivers of partly full GPUs (scorers/fragmentation.py). ``chain``: the worker
    filters (default filters.CHAIN; a group member's is filters.member_chain)."""
    config = config or PolicyConfig()
    occ = occupancy.of(snapshot).without(exclude)
    ctx = Context(spec, snapshot, request, config, occ.allocatable_with(config.foreign_memory_margin), exclude, occ)
    workers, verdicts = filters.run_chain(ctx, list(snapshot.workers), filters.CHAIN if chain is None else chain)
    if not workers:
        return Decision(False, None, None, [], verdicts, *reasons.rank(verdicts))
    msgs: list[str] = []
    strategy, cands = selectors.select(ctx, workers, msgs)
    if not cands:
        named = foreign.refusal(workers, config.foreign_memory_margin)  # second: within the PENDING reason's three
        if named:
            msgs = (msgs or [reasons.NO_FIT])[:1] + [named] + msgs[1:]
        return Decision(False, None, None, [], verdicts, *reasons.rank(verdicts, msgs))
    cands, refused = topology_policy.keep(snapshot, spec.topology_policy, cands)
    if not cands:
        return Decision(False, None, strategy, [], verdicts, *reasons.rank(verdicts, refused))
    flags = None if isinstance(cands, GpuRows) else fragmentation.flags(cands, ctx.occupancy.workers)
    if whole_only and flags and any(flags):
        cands = [c for c, f in zip(cands, flags) if not f]
        if not cands:
            return Decision(False, None, strategy, [], verdicts, *reasons.rank(verdicts, [
                f"fragmentation: every placement found ({strategy}) holds GPUs in slivers of what partly full "
                "GPUs have left; whole GPUs are wanted"]))
        flags = None
    apply_chain(cands, scale_up_chain(ctx, flags))
    best = pick(cands)
    placed = reasons.rank(verdicts, scheduled=True)[0]
    w = snapshot.worker(best.worker) if occ.foreign else None  # other processes' memory where it went
    note = foreign.placed_note(w, best.gpu_indexes, config.foreign_memory_margin) if w is not None else None
    notes = ([note] if note else []) + topology_notes(ctx, cands, best)
    return Decision(True, best, strategy, cands, verdicts, placed + notes)


def topology_notes(ctx: Context, cands: list[Candidate], best: Candidate) -> list[str]:
    """Each candidate's link level (where workers report topology), and the placement's CPU
    binding when the spec asks for pinning (a note when the worker cannot say)."""
    if ctx.occupancy.topology and not isinstance(cands, GpuRows):  # one GPU each: no link to name
        for c, lv in zip(cands, topology.links(ctx.snapshot, cands)):
            c.link = lv
    notes = topology_policy.admitted_note(ctx.snapshot, ctx.spec.topology_policy, best)
    if not topology_policy.wants_pinning(ctx.spec):
        return notes
    best.cpus, best.numa_nodes = topology_policy.binding(ctx.snapshot, best)
    if best.cpus is None and best.numa_nodes is None:
        notes.append(f"cpu pinning: worker {best.worker} reports no NUMA node or local CPUs for GPUs "
                     f"{best.gpu_indexes}; the engine will run unpinned")
    return notes
