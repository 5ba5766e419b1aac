"""Each active prefill/decode group's degradations now, read from the store: its spec (roles,
gather), its members' rows (role, state, worker) and its hosts' labels, judged by the pure
scheduler/groups/status.py. What the ``gpuflow_group_degraded`` metric says at scrape time."""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel import Session, select

from scheduler.cluster import ClusterSnapshot, Worker
from scheduler.groups.spec import Gather, RoleName, RoleSpec
from scheduler.groups.status import MemberNow, counts, degradations
from store.tables import DeploymentRow, InstanceRow, WorkerRow

GONE = ("deleted",)  # rows of members that no longer count


@dataclass
class Standing:
    """A group now: each role's (running, wanted), in the spec's order, and its degradations."""

    counts: dict[RoleName, tuple[int, int]]
    degradations: list[str]


def _cluster(s: Session) -> ClusterSnapshot:
    """The hosts with their labels: all a group's gather reads of them."""
    return ClusterSnapshot(workers=[Worker(name=w.name, ram_total=max(w.ram_total, 0), labels=w.labels or {})
                                    for w in s.exec(select(WorkerRow))])


def standing(s: Session, d: DeploymentRow, cluster: ClusterSnapshot | None = None) -> Standing | None:
    """Deployment ``d``'s group now; None when it has no roles (or a spec this control plane cannot
    read: its workflow reports that)."""
    spec = d.spec or {}
    if not spec.get("roles"):
        return None
    try:
        roles = [RoleSpec.model_validate(r) for r in spec["roles"]]
        gather = Gather.model_validate(spec["gather"]) if spec.get("gather") else None
    except ValueError:
        return None
    rows = s.exec(select(InstanceRow).where(InstanceRow.group_name == d.name, InstanceRow.role.is_not(None)))
    members = [MemberNow(RoleName(r.role), r.state, r.worker) for r in rows if r.state not in GONE]
    return Standing(counts(roles, members), degradations(roles, gather, members, cluster or _cluster(s)))


def group_degradations(s: Session) -> dict[str, list[str]]:
    """Deployment name -> its degradations (scheduler.groups.status.KINDS), for every active group."""
    groups = [d for d in s.exec(select(DeploymentRow).where(DeploymentRow.state == "active")) if (d.spec or {}).get("roles")]
    cluster = _cluster(s) if groups else None
    out: dict[str, list[str]] = {}
    for d in groups:
        got = standing(s, d, cluster)
        if got is not None:
            out[d.name] = got.degradations
    return out
