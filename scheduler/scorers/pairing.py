"""Pairing affinity: a scaled-out prefill goes where the decodes are, a decode where the prefills
are (GPUStack 2.3.0's PairingAffinityScorer).

With x prefills, y decodes and p_j, d_j of each on worker j, a router that picks a request's two
ends independently finds them on one host with probability (1/xy) * sum_j p_j * d_j. One more
prefill on worker j raises the sum by d_j, and (x+1)*y is the same wherever it lands: the best
worker holds the most decodes (the reverse for a decode). Under 3P1D a rule of "most of the
group" would stack the fourth prefill on the prefills and move the sum by nothing.

    share(candidate) = mean over its workers of opposite(worker)   (one worker: opposite(worker))
    points           = W * share
    W                = max(FLOOR, ceilings + 1)                   (FLOOR = 200, GPUStack's default)

``opposite(worker)`` counts the group's members of the opposite role on the worker, once per
worker a member holds (main and subordinates), any state: a member still starting holds its GPUs
and will pair from there. The points are multiplied, not normalised: one more opposite member is
always worth a full W, and W is one more than everything else the chain can pay (``ceilings``:
the sum of its scorers' weights, proximity's ``STEP * tightest`` among them), so affinity decides
and capacity only orders equals. As a chain scorer: raw = 100 * share / peak, weight W * peak
(peak: the most opposite members on any worker; 0: the scorer is off, nothing to be near).

A router (no opposite role) gets none: proximity already pulls it toward the group.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from scheduler.cluster import Instance, InstanceState
from scheduler.groups.spec import RoleName
from scheduler.groups.domains import member_workers
from scheduler.scorers.proximity import spans

FLOOR = 200.0  # GPUStack's SCHEDULER_PAIRING_AFFINITY_MAX_SCORE: a floor, raised to the chain's ceilings + 1
OPPOSITE = {RoleName.PREFILL: RoleName.DECODE, RoleName.DECODE: RoleName.PREFILL}


def opposite_counts(instances: Iterable[Instance], group: str, role: RoleName,
                    leaving: bool = True) -> dict[str, int]:
    """Worker -> how many of the group's members of ``role``'s opposite it holds. ``leaving``:
    count members on their way out (STOPPING) too; scale-in does not (they pair with nobody soon)."""
    opposite = OPPOSITE.get(RoleName(role))
    out: dict[str, int] = {}
    if opposite is None:
        return out
    for i in instances:
        if i.group != group or i.role != opposite or (not leaving and i.state == InstanceState.STOPPING):
            continue
        for w in workers_of(i):
            out[w] = out.get(w, 0) + 1
    return out


def workers_of(inst: Instance) -> list[str]:
    """The workers a member holds, main first, each once (two parts on one worker count once)."""
    return list(dict.fromkeys(member_workers(inst)))


def share(workers: list[str], counts: dict[str, int]) -> float:
    """What one member on ``workers`` is worth: the mean of their opposite counts (its own width divides)."""
    return sum(counts.get(w, 0) for w in workers) / len(workers) if workers else 0.0


def weight(ceilings: float, floor: float = FLOOR) -> float:
    """W: the floor, or one more than the rest of the chain can pay. 0 is off and stays 0."""
    return floor if floor <= 0 else max(floor, ceilings + 1)


def shares(cands: Sequence, counts: dict[str, int]) -> list[float]:
    return [share(span, counts) for span in spans(cands)]


def scores(cands: Sequence, counts: dict[str, int]) -> list[float]:
    """The chain's raw 0..100 (weight ``W * peak``)."""
    peak = max(counts.values(), default=0)
    return [100.0 * s / peak if peak else 0.0 for s in shares(cands, counts)]
