"""Topology proximity: a group member placed after formation (a scale-out, the router) goes near
the group's members already placed, by the cluster's layers (GPUStack 2.3.0's
TopologyProximityScorer).

The layers are the chain root to leaf (scheduler/groups/layers.py), keeping a built-in rung (zone,
rack) only where some host carries one of its labels and every layer the cluster declares, the
host last; a layer's depth is its place on that chain counted from 1, the host deepest
(``tightest``). Two hosts share a layer when their domains agree at it and at every layer above
it (a rack is a rack within its zone). The anchors are the workers of the group's weight-bearing
members (prefill and decode; a router holds no weights, so it says nothing about where the group
is), every worker of a member (main and subordinates).

    near(candidate)  = the deepest layer any of its workers shares with any anchor (0: none)
    points           = STEP * near        (STEP = 150, GPUStack's default; host shared: 150 * tightest)

As a chain scorer: raw = 100 * near / tightest, weight STEP * tightest (the ceiling pairing
affinity is sized against).

Internal spread comes first, by removal, not by points (``narrow``): among candidates spanning
workers, only those whose own workers are tightest together stay (a member's all-reduce runs
every layer of every token, its KV hand-off once a request). GPUStack also subtracts
STEP * (tightest + 1) * (tightest - internal) from each candidate; after the narrowing that term
is the same for every survivor, so it is left out here (our chain's points are 0..weight).

Where gpuflow differs (docs/gpustack-differences.md): two hosts unclassified at a layer but
sharing a classified layer above it (same zone, no rack label) share the zone here; GPUStack's
tree stops at the unclassified bucket and scores them 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.candidates import GpuRows
from scheduler.cluster import ClusterSnapshot, Instance
from scheduler.groups.layers import NODE_LAYER, TopologyLayer, chain, domain_of
from scheduler.groups.spec import RoleName

STEP = 150.0  # points per layer shared (GPUStack's SCHEDULER_TOPOLOGY_PROXIMITY_MAX_SCORE)
ANCHORS = (RoleName.PREFILL, RoleName.DECODE)  # the roles that say where the group is

Path = tuple[str | None, ...]  # a host's domain at each layer, root to leaf (the host's name last)


def layers(snapshot: ClusterSnapshot) -> list[TopologyLayer]:
    """The chain the depths are read off: built-in rungs some host carries, declared layers, the host."""
    declared = {x.id for x in snapshot.topology}
    return [x for x in chain(snapshot.topology)
            if x.id == NODE_LAYER or x.id in declared or any(domain_of(w, x) for w in snapshot.workers)]


def paths(snapshot: ClusterSnapshot, chain_: list[TopologyLayer]) -> dict[str, Path]:
    return {w.name: tuple(domain_of(w, x) for x in chain_) for w in snapshot.workers}


def shared(a: Path, b: Path) -> int:
    """The depth of the deepest classified layer two hosts share (0: none)."""
    best = 0
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            break
        if x is not None:
            best = k + 1
    return best


def member_workers(inst: Instance) -> list[str]:
    """Every worker a member holds, main first, each once."""
    out = [inst.worker] if inst.worker else []
    for s in inst.subordinates:
        if s.worker and s.worker not in out:
            out.append(s.worker)
    return out


def spans(cands: Sequence) -> list[list[str]]:
    """Each candidate's workers, main first, each once."""
    if isinstance(cands, GpuRows):
        return [[w] for w in cands.workers]
    return [list(dict.fromkeys(c.workers)) for c in cands]


def anchors(snapshot: ClusterSnapshot, group: str) -> list[str]:
    """The workers of the group's placed weight-bearing members, each once, in snapshot order."""
    out: dict[str, None] = {}
    for i in snapshot.instances:
        if i.group == group and i.role in ANCHORS:
            out.update(dict.fromkeys(member_workers(i)))
    return list(out)


def internal(span: list[str], where: dict[str, Path], tightest: int) -> int:
    """How tight a candidate is inside itself: its loosest pair of workers (one worker: tightest)."""
    ps = [where[w] for w in span if w in where]
    if len(ps) < 2:
        return tightest
    return min(shared(a, b) for k, a in enumerate(ps) for b in ps[k + 1:])


def narrow(cands: Sequence, where: dict[str, Path], tightest: int) -> Sequence:
    """Only the candidates tightest inside themselves; never empties the list. One-GPU rows and
    candidates on one worker each are all at ``tightest``: the list comes back as it was."""
    if isinstance(cands, GpuRows) or len(cands) < 2:
        return cands
    inner = [internal(s, where, tightest) for s in spans(cands)]
    best = max(inner)
    if all(x == best for x in inner):
        return cands
    return [c for c, x in zip(cands, inner) if x == best]


def nears(cands: Sequence, placed: list[str], where: dict[str, Path]) -> list[int]:
    """Each candidate's ``near``: the deepest layer it shares with any anchor."""
    at = [where[a] for a in placed if a in where]
    out = []
    for span in spans(cands):
        out.append(max((shared(a, where[w]) for a in at for w in span if w in where), default=0))
    return out


def scores(near: list[int], tightest: int) -> list[float]:
    """The chain's raw 0..100 (weight ``STEP * tightest``)."""
    return [100.0 * n / tightest if tightest else 0.0 for n in near]
