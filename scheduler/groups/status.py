"""How a prefill/decode group stands, from its members as they are: each role's running members
against its wanted replicas (``prefill 2/2, decode 1/2``), and its degradations, in GPUStack's
words: ``ratio_unmet`` (a role runs fewer members than it wants: the P:D ratio the spec states is
not what serves), ``gather_unmet`` (the prefill/decode members share less than the layer a
PreferGather asked for) and ``pd_ineffective`` (its decodes serve requests without remote KV: the
group has collapsed into aggregated serving; judged in scheduler/groups/pd_health.py). Pure: what ``gpuflow status``, the console, the deployment's details in
the Temporal UI and the ``gpuflow_group_degraded`` metric all say."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduler.groups import domains
from scheduler.groups.spec import Gather, GatherStrategy, RoleName, RoleSpec

if TYPE_CHECKING:  # the snapshot's model is its caller's: `gpuflow deploy` starts without it (issue 37)
    from scheduler.cluster import ClusterSnapshot

RATIO_UNMET = "ratio_unmet"
GATHER_UNMET = "gather_unmet"
PD_INEFFECTIVE = "pd_ineffective"
KINDS = (RATIO_UNMET, GATHER_UNMET, PD_INEFFECTIVE)
GANG = (RoleName.PREFILL, RoleName.DECODE)  # the roles that hold weights and hand KV across
# a formation whose model cannot be estimated (the spec's fault, as a plain replica's GIVE_UP words
# it: workflows/place_machine.py): its members are ERROR with this reason, not PENDING
MODEL_BAD = "cannot estimate the model"


@dataclass(frozen=True)
class MemberNow:
    """One member as it is: its role, its state (the store's word: running, pending, ...) and where
    it runs (None: not placed)."""

    role: RoleName
    state: str
    worker: str | None = None


def counts(roles: list[RoleSpec], members: list[MemberNow]) -> dict[RoleName, tuple[int, int]]:
    """Each role of the spec, in its order: (members running, replicas wanted)."""
    return {r.name: (sum(1 for m in members if m.role == r.name and m.state == "running"), r.replicas) for r in roles}


def counts_text(c: dict[RoleName, tuple[int, int]]) -> str:
    """``prefill 2/2, decode 1/2, router 1/1``."""
    return ", ".join(f"{role.value} {ran}/{want}" for role, (ran, want) in c.items())


def ratio_unmet(c: dict[RoleName, tuple[int, int]]) -> bool:
    return any(ran < want for ran, want in c.values())


def gather_unmet(gather: Gather | None, members: list[MemberNow], cluster: ClusterSnapshot) -> bool:
    """Placed prefill/decode members that share less than ``gather.layer``, on ``cluster``'s hosts
    and layers (its instances are not read). Only PreferGather with a layer reports it (MustGather
    never places looser; no layer: nothing was asked)."""
    if gather is None or gather.strategy != GatherStrategy.PREFER_GATHER or not gather.layer:
        return False
    names = sorted({m.worker for m in members if m.role in GANG and m.worker})
    if not names:
        return False  # nothing placed: nothing is loose yet
    layers = domains.active_layers(cluster)
    shared = domains.depth(domains.paths(cluster.workers, layers), names)
    return domains.looser(cluster, layers, shared, gather.layer)


def degradations(roles: list[RoleSpec], gather: Gather | None, members: list[MemberNow],
                 cluster: ClusterSnapshot, pd_ineffective: bool = False) -> list[str]:
    """The group's degradations now, in KINDS order (``pd_ineffective``: what pd_health.judge said)."""
    out = []
    if ratio_unmet(counts(roles, members)):
        out.append(RATIO_UNMET)
    if gather_unmet(gather, members, cluster):
        out.append(GATHER_UNMET)
    if pd_ineffective:
        out.append(PD_INEFFECTIVE)
    return out
