"""Scale-down ranking: which instances of a model to remove first (lowest score first).

score = status*100 + offloaded-layers*10 + placement-in-removal-mode*1 (weights configurable).
Unlike GPUStack, placement sees every instance on each worker, not only this model's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.allocatable import allocatable_map
from scheduler.cluster import ClusterSnapshot, Instance
from scheduler.policy_config import PolicyConfig
from scheduler.scorers import apply_chain, binpack, offload, spread, status
from scheduler.spec import PlacementStrategy


@dataclass
class Ranked:
    instance: Instance
    score: float = 0.0
    scores: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        i = self.instance
        return {"name": i.name, "state": i.state.value, "worker": i.worker, "gpu_indexes": i.gpu_indexes,
                "score": round(self.score, 4), "scores": {k: round(v, 4) for k, v in self.scores.items()}}


def _placement(snapshot: ClusterSnapshot, model: str, strategy: PlacementStrategy, ranked: list[Ranked]) -> list[float]:
    if strategy == PlacementStrategy.BINPACK:
        alloc = allocatable_map(snapshot)
        return [binpack.score(r.instance.worker, r.instance.gpu_indexes, r.instance.claim, r.instance.subordinates,
                              alloc, removal=True) if r.instance.worker else 0.0 for r in ranked]
    counts = spread.count(snapshot.instances, model)
    workers = [w.name for w in snapshot.workers]
    raw = spread.scores([(r.instance.worker, r.instance.gpu_indexes) for r in ranked], counts, workers)
    return [s if r.instance.worker else 0.0 for s, r in zip(raw, ranked)]


def rank(snapshot: ClusterSnapshot, model: str, strategy: PlacementStrategy = PlacementStrategy.SPREAD,
         config: PolicyConfig | None = None) -> list[Ranked]:
    """The model's instances, removal order first (ascending score, stable)."""
    cfg = config or PolicyConfig()
    ranked = [Ranked(i) for i in snapshot.instances if i.model == model]
    chain = [
        ("status", cfg.scale_down_status, lambda rs: [status.score(r.instance, snapshot.worker(r.instance.worker) if r.instance.worker else None) for r in rs]),
        ("offload", cfg.scale_down_offload, lambda rs: [offload.score(r.instance.claim) for r in rs]),
        ("placement", cfg.scale_down_placement, lambda rs: _placement(snapshot, model, strategy, rs)),
    ]
    apply_chain(ranked, chain)
    return sorted(ranked, key=lambda r: r.score)
