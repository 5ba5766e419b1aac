"""Which member of a group's role scale-in removes (GPUStack 2.3.0's find_scale_down_candidates
for one role, with ``peers``: the whole group).

The role's members (Instance.group == the deployment, Instance.role == the role), those already
on their way out (STOPPING) left out, are scored and the lowest goes; equal scores go to the first
in the snapshot's order (a stable ascending sort, as GPUStack's):

    score = status (100: running on a ready worker, 50: starting or unsure, 0: broken or gone)
          + offload (10 * offloaded/total GGUF layers)
          + retention (20 * opposite members beside it / the most on any worker; scorers/retention.py)
          + placement (1 * spread or binpack in removal mode)

Placement spreads over the role's members: ``cur`` counts this role's members of the group on a
worker, ``oth`` every other instance there (the opposite role, the router, other deployments) —
as scheduler/scale_down.py counts every instance, where GPUStack's counts see only the role's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.allocatable import allocatable_map
from scheduler.cluster import ClusterSnapshot, Instance, InstanceState
from scheduler.groups.roles import role_spec
from scheduler.groups.spec import RoleName
from scheduler.policy_config import PolicyConfig
from scheduler.scorers import apply_chain, binpack, offload, pairing, retention, spread, status
from scheduler.spec import ModelSpec, PlacementStrategy


@dataclass
class MemberPoints:
    """One member of the role: its scorers' points, their sum, and why."""

    instance: Instance
    score: float = 0.0
    scores: dict[str, float] = field(default_factory=dict)
    why: str = ""

    def to_dict(self) -> dict:
        i = self.instance
        return {"name": i.name, "worker": i.worker, "state": i.state.value, "score": round(self.score, 4),
                "scores": {k: round(v, 4) for k, v in self.scores.items()}, "why": self.why}


@dataclass
class ScaleInChoice:
    victim: str | None  # the member scale-in removes; None: the role has no member to remove
    members: list[MemberPoints]  # the role's members, removal order first
    reasons: list[str]

    def to_dict(self) -> dict:
        return {"victim": self.victim, "members": [m.to_dict() for m in self.members], "reasons": self.reasons}


def scale_in(snapshot: ClusterSnapshot, spec: ModelSpec, role: RoleName, group: str,
             config: PolicyConfig | None = None) -> ScaleInChoice:
    """The ``role`` member of ``spec``'s group that scale-in removes, each member's points and why."""
    role, cfg = RoleName(role), config or PolicyConfig()
    strategy = role_spec(spec, role).placement_strategy
    leaving = [i.name for i in snapshot.instances if _mine(i, group, role) and i.state == InstanceState.STOPPING]
    members = [MemberPoints(i) for i in snapshot.instances if _mine(i, group, role) and i.name not in leaving]
    counts = pairing.opposite_counts(snapshot.instances, group, role, leaving=False)
    workers = {w.name: w for w in snapshot.workers}
    chain = [
        ("status", cfg.scale_down_status,
         lambda ms: [status.score(m.instance, workers.get(m.instance.worker)) for m in ms]),
        ("offload", cfg.scale_down_offload, lambda ms: [offload.score(m.instance.claim) for m in ms]),
        ("retention", retention.MAX, lambda ms: retention.scores([m.instance for m in ms], counts)),
        ("placement", cfg.scale_down_placement, lambda ms: _placement(snapshot, group, role, strategy, ms)),
    ]
    apply_chain(members, chain)
    members.sort(key=lambda m: m.score)
    for m in members:
        m.why = _why(m, role, counts)
    return ScaleInChoice(members[0].instance.name if members else None, members, _reasons(role, members, leaving))


def _mine(i: Instance, group: str, role: RoleName) -> bool:
    return i.group == group and i.role == role


def _placement(snapshot: ClusterSnapshot, group: str, role: RoleName, strategy: PlacementStrategy,
               members: list[MemberPoints]) -> list[float]:
    if strategy == PlacementStrategy.BINPACK:
        alloc = allocatable_map(snapshot)
        return [binpack.score(m.instance.worker, m.instance.gpu_indexes, m.instance.claim, m.instance.subordinates,
                              alloc, removal=True) if m.instance.worker else 0.0 for m in members]
    counts = _role_counts(snapshot.instances, group, role)
    raw = spread.scores([(m.instance.worker, m.instance.gpu_indexes) for m in members], counts,
                        [w.name for w in snapshot.workers])
    return [s if m.instance.worker else 0.0 for s, m in zip(raw, members)]


def _role_counts(instances: list[Instance], group: str, role: RoleName) -> dict[str, spread.Counts]:
    """spread.count with ``cur`` the role's members of the group (GPU slots; one slot without GPUs)."""
    out: dict[str, spread.Counts] = {}
    for inst in instances:
        mine = _mine(inst, group, role)
        for worker, gpus in [(inst.worker, inst.gpu_indexes)] + [(s.worker, s.gpu_indexes) for s in inst.subordinates]:
            if worker is None:
                continue
            c = out.setdefault(worker, spread.Counts())
            for g in gpus or [None]:
                if mine:
                    c.cur += 1
                    if g is not None:
                        c.gpu_cur[g] = c.gpu_cur.get(g, 0) + 1
                else:
                    c.oth += 1
                    if g is not None:
                        c.gpu_oth[g] = c.gpu_oth.get(g, 0) + 1
    return out


def _why(m: MemberPoints, role: RoleName, counts: dict[str, int]) -> str:
    parts = [f"{k} {v:.4g}" for k, v in m.scores.items()]
    opposite = pairing.OPPOSITE.get(role)
    if opposite is not None:
        beside = pairing.share(pairing.workers_of(m.instance), counts)
        parts.append(f"{beside:g} {opposite.value}(s) beside it (most on a worker: {max(counts.values(), default=0)})")
    return ", ".join(parts)


def _reasons(role: RoleName, members: list[MemberPoints], leaving: list[str]) -> list[str]:
    out = []
    if not members:
        out.append(f"no {role.value} member to remove" + (f" ({', '.join(leaving)} already stopping)" if leaving else ""))
    else:
        v = members[0]
        out.append(f"{v.instance.name} goes: the lowest score, {v.score:.4g} ({v.why})")
        if len(members) > 1 and round(members[1].score, 9) == round(v.score, 9):
            out.append(f"tie with {members[1].instance.name}: the first in the snapshot's order goes")
        if leaving:
            out.append(f"left out, already stopping: {', '.join(leaving)}")
    return out
