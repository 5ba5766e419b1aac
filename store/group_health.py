"""Each active prefill/decode group's degradations now, read from the store: its spec (roles,
gather), its members' rows (role, state, worker), its hosts' labels and the PD counts of the last
minutes (store/pd_counts.py: the gateways' and the decodes' own), judged by the pure
scheduler/groups/status.py and pd_health.py. What the ``gpuflow_group_degraded`` metric, the
console and the deployment workflow (activities/pd_health.py) say."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlmodel import Session, select

from scheduler.cluster import ClusterSnapshot, Worker
from scheduler.groups import pd_health
from scheduler.groups.spec import Disaggregation, Gather, RoleName, RoleSpec
from scheduler.groups.status import PD_INEFFECTIVE, MemberNow, counts, degradations
from store import pd_counts
from store.tables import DeploymentRow, InstanceRow, WorkerRow

GONE = ("deleted",)  # rows of members that no longer count


@dataclass
class Standing:
    """A group now: each role's (running, wanted), in the spec's order, and its degradations."""

    counts: dict[RoleName, tuple[int, int]]
    degradations: list[str]
    why: dict[str, str] = field(default_factory=dict)  # a degradation -> what shows it (pd_ineffective's counts)


def _cluster(s: Session) -> ClusterSnapshot:
    """The hosts with their labels: all a group's gather reads of them."""
    return ClusterSnapshot(workers=[Worker(name=w.name, ram_total=max(w.ram_total, 0), labels=w.labels or {})
                                    for w in s.exec(select(WorkerRow))])


def skip_tokens(spec: dict) -> int:
    """The group's skip threshold in uncached tokens (its disaggregation's, else the default)."""
    try:
        return Disaggregation.model_validate(spec["disaggregation"]).skip_prefill_below
    except (KeyError, TypeError, ValueError):
        return pd_health.SKIP_TOKENS


def pd_judged(s: Session, names: list[str], now: datetime | float | None = None) -> dict[str, str]:
    """Deployment -> why it is pd_ineffective now, of ``names`` (the others are not)."""
    if not names:
        return {}
    at = pd_counts.seconds(now)
    got = pd_counts.samples_in(s, at - max(pd_health.WINDOW_S, pd_health.ENGINE_WINDOW_S), at, names)
    skips = {d.name: skip_tokens(d.spec or {}) for d in s.exec(select(DeploymentRow).where(DeploymentRow.name.in_(names)))}
    return pd_health.judge(got, at, skips)


def standing(s: Session, d: DeploymentRow, cluster: ClusterSnapshot | None = None,
             pd: dict[str, str] | None = None) -> Standing | None:
    """Deployment ``d``'s group now; None when it has no roles (or a spec this control plane cannot
    read: its workflow reports that). ``pd``: pd_judged's answer when read already for many."""
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
    why = pd_judged(s, [d.name]) if pd is None else pd
    got = degradations(roles, gather, members, cluster or _cluster(s), pd_ineffective=d.name in why)
    return Standing(counts(roles, members), got, {PD_INEFFECTIVE: why[d.name]} if d.name in why else {})


def group_degradations(s: Session) -> dict[str, list[str]]:
    """Deployment name -> its degradations (scheduler.groups.status.KINDS), for every active group."""
    groups = [d for d in s.exec(select(DeploymentRow).where(DeploymentRow.state == "active")) if (d.spec or {}).get("roles")]
    cluster = _cluster(s) if groups else None
    pd = pd_judged(s, [d.name for d in groups])
    out: dict[str, list[str]] = {}
    for d in groups:
        got = standing(s, d, cluster, pd)
        if got is not None:
            out[d.name] = got.degradations
    return out
