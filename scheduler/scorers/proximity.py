"""Topology proximity: a group member placed after formation (a scale-out, the router) goes near
the group's members already placed, by the cluster's layers (GPUStack 2.3.0's
TopologyProximityScorer).

The layers are the chain root to leaf (scheduler/groups/domains.py active_layers), keeping a built-in rung (zone,
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
from scheduler.groups.domains import Path, depth

STEP = 150.0  # points per layer shared (GPUStack's SCHEDULER_TOPOLOGY_PROXIMITY_MAX_SCORE)


def spans(cands: Sequence) -> list[list[str]]:
    """Each candidate's workers, main first, each once."""
    if isinstance(cands, GpuRows):
        return [[w] for w in cands.workers]
    return [list(dict.fromkeys(c.workers)) for c in cands]


def internal(span: list[str], where: dict[str, Path], tightest: int) -> int:
    """How tight a candidate is inside itself: the deepest layer all its workers share (one worker: tightest)."""
    return tightest if len(span) < 2 else depth(where, span)


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
    """Each candidate's ``near``: the deepest layer any of its workers shares with any anchor."""
    return [max((depth(where, [a, w]) for a in placed for w in span), default=0) for span in spans(cands)]


def scores(near: list[int], tightest: int) -> list[float]:
    """The chain's raw 0..100 (weight ``STEP * tightest``)."""
    return [100.0 * n / tightest if tightest else 0.0 for n in near]
