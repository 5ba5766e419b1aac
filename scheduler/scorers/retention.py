"""Pairing retention: scaling a role in removes the member with the fewest opposite-role members
beside it (GPUStack 2.3.0's PairingRetentionScorer), the inverse of pairing affinity on the same
count: removing a prefill from worker j lowers sum_j p_j * d_j by d_j, and (x-1)*y is the same
whichever goes.

    points = MAX * share(member) / peak         (MAX = 20, GPUStack's default)

``share`` is pairing.share (the mean opposite count over the member's workers), ``peak`` the most
opposite members on any worker; members on their way out (STOPPING) are not counted. All 0 when
the role has no opposite (the router) or no opposite member is placed. Bounded, unlike affinity,
and kept below the status scorer's 50-point step: a broken member (status 0) goes before a
healthy one however many partners the healthy one has, and a starting member (50) before a
running one (100).
"""

from __future__ import annotations

from scheduler.cluster import Instance
from scheduler.scorers.pairing import share, workers_of

MAX = 20.0  # GPUStack's SCHEDULER_SCALE_DOWN_PAIRING_MAX_SCORE (under StatusScorer's 50-point step)


def scores(members: list[Instance], counts: dict[str, int]) -> list[float]:
    """The chain's raw 0..100 (weight MAX): 100 * share / peak."""
    peak = max(counts.values(), default=0)
    return [100.0 * share(workers_of(m), counts) / peak if peak else 0.0 for m in members]
