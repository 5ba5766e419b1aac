"""What a decision is made of: candidates with each scorer's contribution, per-filter verdicts
with per-worker reasons, and the decision itself. Plain data; ``to_dict`` gives the CLI's JSON."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scheduler.allocatable import Allocatable
from scheduler.cluster import ClusterSnapshot
from scheduler.request import Request
from scheduler.spec import ModelSpec
from scheduler.policy_config import PolicyConfig

if TYPE_CHECKING:
    from scheduler.occupancy import Occupancy


@dataclass(slots=True)
class PlannedClaim:
    """A candidate's claim: the same fields as cluster.Claim, as a plain dataclass because
    selectors build thousands per decision (pydantic construction was half the decision time)."""

    ram: int = 0
    vram: dict[int, int] = field(default_factory=dict)
    offload_layers: int | None = None
    total_layers: int | None = None
    tensor_split: list[int] | None = None
    is_unified_memory: bool = False
    vram_utilization: float | None = None

    def model_dump(self, mode: str = "json", exclude_none: bool = False) -> dict:
        d = {k: getattr(self, k) for k in self.__slots__}
        return {k: v for k, v in d.items() if v is not None} if exclude_none else d


@dataclass(slots=True)
class PlannedSubordinate:
    worker: str
    gpu_indexes: list[int]
    claim: PlannedClaim

    def model_dump(self, mode: str = "json", exclude_none: bool = False) -> dict:
        return {"worker": self.worker, "gpu_indexes": self.gpu_indexes,
                "claim": self.claim.model_dump(mode, exclude_none)}


claim = PlannedClaim  # selectors call claim(ram=..., vram=..., ...)


def subordinate(worker: str, gpu_indexes: list[int], c: PlannedClaim) -> PlannedSubordinate:
    return PlannedSubordinate(worker, gpu_indexes, c)


@dataclass(slots=True)
class Candidate:
    worker: str
    gpu_indexes: list[int]
    claim: PlannedClaim
    subordinates: list[PlannedSubordinate] = field(default_factory=list)
    gpu_type: str | None = None
    overcommit: bool = False
    score: float = 0.0
    scores: dict[str, float] = field(default_factory=dict)
    link: str | None = None  # the level joining its GPUs, where the worker reports topology
    cpus: str | None = None  # CPU pinning: the CPU list to bind the engine to, and those CPUs' NUMA nodes
    numa_nodes: list[int] | None = None

    @property
    def workers(self) -> list[str]:
        return [self.worker] + [s.worker for s in self.subordinates]

    def to_dict(self, with_scores: bool = True) -> dict:
        d = {"worker": self.worker, "gpu_indexes": self.gpu_indexes,
             "claim": self.claim.model_dump(mode="json", exclude_none=True),
             "subordinates": [s.model_dump(mode="json", exclude_none=True) for s in self.subordinates]}
        if self.overcommit:
            d["overcommit"] = True
        d.update({k: getattr(self, k) for k in ("link", "cpus", "numa_nodes") if getattr(self, k) is not None})
        if with_scores:
            d["score"] = round(self.score, 4)
            d["scores"] = {k: round(v, 4) for k, v in self.scores.items()}
        return d


@dataclass
class FilterVerdict:
    name: str
    before: int
    kept: list[str]
    removed: dict[str, list[str]]  # worker -> reasons
    note: str | None = None  # the filter's summary line, GPUStack-style

    def to_dict(self) -> dict:
        return {"filter": self.name, "before": self.before, "kept": len(self.kept),
                "removed": [{"worker": w, "reasons": r} for w, r in self.removed.items()],
                **({"note": self.note} if self.note else {})}


@dataclass
class Context:
    """Everything one scheduling cycle reads; computed once, passed to every unit."""

    spec: ModelSpec
    snapshot: ClusterSnapshot
    request: Request
    config: PolicyConfig
    allocatable: dict[str, Allocatable]
    exclude: str | None = None  # the instance being re-placed: its own claim does not count
    occupancy: Occupancy | None = None  # the snapshot's sums, ``exclude`` left out (scheduler/occupancy.py)


@dataclass
class Decision:
    scheduled: bool
    placement: Candidate | None
    strategy: str | None
    candidates: list[Candidate]
    filters: list[FilterVerdict]
    reasons: list[str]  # the decisive ones first (scheduler/reasons.py)
    decisive: int = 0  # how many of ``reasons`` decided that the replica is not placed

    @property
    def score(self) -> float | None:
        return self.placement.score if self.placement else None

    def top(self, n: int) -> list[Candidate]:
        """The n best candidates by score rounded to 4 places, equals in the policy's order
        (heapq.nsmallest is sorted()[:n]); one-GPU rows build only those (candidates.py)."""
        if hasattr(self.candidates, "top"):
            return self.candidates.top(n)
        return heapq.nsmallest(n, self.candidates, key=lambda c: -round(c.score, 4))

    def to_dict(self, candidates: list[Candidate] | None = None) -> dict:
        """``candidates``: the ones to list (default: all)."""
        candidates = self.candidates if candidates is None else candidates
        return {"scheduled": self.scheduled,
                "placement": self.placement.to_dict(with_scores=False) if self.placement else None,
                "strategy": self.strategy,
                "score": round(self.score, 4) if self.score is not None else None,
                "candidates": [c.to_dict() for c in candidates],
                "filters": [f.to_dict() for f in self.filters],
                "reasons": self.reasons, "decisive": self.decisive}
