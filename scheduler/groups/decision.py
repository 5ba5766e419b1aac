"""What a group's formation decides: every member with its own Decision (the ordinary one, its
filters' per-worker reasons included), the topology domain the group was gathered into, its
degradations, and, when it does not fit, the role that does not and that role's hosts' reasons.
Plain data; ``to_dict`` gives the CLI's JSON. Nothing is scheduled unless everything is."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.decision import Decision
from scheduler.groups.spec import RoleName

GATHER_UNMET = "gather_unmet"  # the members sit looser than the layer PreferGather asked for


@dataclass
class Member:
    role: RoleName
    ordinal: int  # 0.. within its role, in the order formation dealt them
    decision: Decision  # the member's own decision (its placement, filters, candidates, reasons)

    @property
    def worker(self) -> str:
        return self.decision.placement.worker

    @property
    def gpu_indexes(self) -> list[int]:
        return list(self.decision.placement.gpu_indexes)

    @property
    def workers(self) -> list[str]:
        """Every worker the member occupies, its main worker first (subordinates after)."""
        return self.decision.placement.workers

    def to_dict(self) -> dict:
        p = self.decision.placement
        return {"role": self.role.value, "ordinal": self.ordinal, "worker": p.worker,
                "gpu_indexes": list(p.gpu_indexes), "strategy": self.decision.strategy,
                "placement": p.to_dict(with_scores=False)}


@dataclass
class GroupDecision:
    scheduled: bool
    members: list[Member] = field(default_factory=list)  # empty unless scheduled: never a partial group
    domain: tuple[str, str] | None = None  # (layer id, domain name) the group was gathered into; None: the cluster
    degradations: list[str] = field(default_factory=list)  # e.g. gather_unmet
    reasons: list[str] = field(default_factory=list)  # not scheduled: the role that does not fit, then its hosts'
    path: list[str] = field(default_factory=list)  # the domain's address, root to leaf (a rack within its zone)
    role: RoleName | None = None  # not scheduled: the role that does not fit
    blocked: Decision | None = None  # not scheduled: that role's decision where the group came closest
    terms: dict[str, float] = field(default_factory=dict)  # what ranked the domain among its layer's (pair, file)

    def of(self, role: RoleName) -> list[Member]:
        return [m for m in self.members if m.role == role]

    def to_dict(self) -> dict:
        return {"scheduled": self.scheduled,
                "members": [m.to_dict() for m in self.members],
                "domain": {"layer": self.domain[0], "name": self.domain[1], "path": self.path}
                if self.domain else None,
                "degradations": list(self.degradations),
                "role": self.role.value if self.role else None,
                "terms": {k: round(v, 4) for k, v in self.terms.items()},
                "reasons": list(self.reasons)}
