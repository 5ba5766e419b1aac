"""Each active prefill/decode group's degradations now, read from the store: its spec (roles,
gather), its members' rows (role, state, worker) and its hosts' labels, judged by the pure
scheduler/groups/status.py. What the ``gpuflow_group_degraded`` metric says at scrape time."""

from __future__ import annotations

from sqlmodel import Session, select

from scheduler.cluster import ClusterSnapshot, Worker
from scheduler.groups.spec import Gather, RoleName, RoleSpec
from scheduler.groups.status import MemberNow, degradations
from store.tables import DeploymentRow, InstanceRow, WorkerRow

GONE = ("deleted",)  # rows of members that no longer count


def group_degradations(s: Session) -> dict[str, list[str]]:
    """Deployment name -> its degradations (scheduler.groups.status.KINDS), for every active group."""
    groups = [d for d in s.exec(select(DeploymentRow).where(DeploymentRow.state == "active")) if d.spec.get("roles")]
    if not groups:
        return {}
    workers = [Worker(name=w.name, ram_total=max(w.ram_total, 0), labels=w.labels or {})
               for w in s.exec(select(WorkerRow))]
    cluster = ClusterSnapshot(workers=workers)
    out: dict[str, list[str]] = {}
    for d in groups:
        try:
            roles = [RoleSpec.model_validate(r) for r in d.spec["roles"]]
            gather = Gather.model_validate(d.spec["gather"]) if d.spec.get("gather") else None
        except ValueError:
            continue  # a spec this control plane cannot read is its workflow's to report
        rows = s.exec(select(InstanceRow).where(InstanceRow.group_name == d.name, InstanceRow.role.is_not(None)))
        members = [MemberNow(RoleName(r.role), r.state, r.worker) for r in rows if r.state not in GONE]
        out[d.name] = degradations(roles, gather, members, cluster)
    return out
