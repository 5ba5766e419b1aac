"""One replica's decision with its tenant's quotas: admission, then preemption. Pure: the
control plane's decide activity passes in the snapshot, the tenants file and who owns what.

1. Decide as usual. A placement that would take the tenant over a limit is refused, the quota
   named first (``quota: tenant poc uses 2 of its 2 GPUs (this replica needs 1)``).
2. A replica that does not fit is costed on an empty cluster (what it would hold at least): a
   tenant already at its limit gets the quota reason first there too.
3. Otherwise, when preemption could apply (its tenant has a guarantee, or it has a deployment of
   lower priority), preemption.plan looks for the fewest victims; the decision then carries them.
4. Whole replicas within a guarantee: a replica that fits only in slivers of partly full GPUs
   (scheduler/scorers/fragmentation.py), of a tenant that stays within its guarantee with the
   replica's whole-GPU shape (what it holds on an empty cluster), takes whole GPUs by preemption
   instead when a preemption can give them (``_whole``). So the replica is placed as it would be
   on an empty cluster of the guarantee's size, and it counts as the GPUs it holds there. When no
   preemption gives whole GPUs, the slivers stand (counted as every GPU they touch).

What the tenant uses never counts the replica itself: it may hold a reservation (or an assumed
placement) while it decides again."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler import occupancy
from scheduler.cluster import ClusterSnapshot
from scheduler.decide import decide
from scheduler.decision import Decision
from scheduler.dry_run import without
from scheduler.policy_config import PolicyConfig
from scheduler.request import Request
from scheduler.spec import ModelSpec
from scheduler.scorers.fragmentation import fragmented
from scheduler.tenancy.admission import over_limit, within_guarantee
from scheduler.tenancy.config import DEFAULT, Tenant, TenantsFile
from scheduler.tenancy.preemption import Owners, Preemption, plan
from scheduler.tenancy.usage import Usage, by_tenant, of_candidate


@dataclass
class Admission:
    decision: Decision
    quota: str | None = None  # the limit it would break: it stays PENDING with this reason first
    preemption: Preemption | None = None  # set when it is placed by taking these victims' GPUs
    notes: list[str] = field(default_factory=list)  # why preemption did not help, when it was tried

    @property
    def victims(self) -> list[str]:
        return list(self.preemption.victims) if self.preemption else []


def may_preempt(spec: ModelSpec, tenants: TenantsFile, owners: Owners) -> bool:
    """Whether plan() could find any candidate at all: a guarantee to reclaim, or a deployment of
    its own tenant with lower priority (cheap: no decision is made)."""
    mine = owners.tenant_of.get(spec.name, "default")
    if (tenants.get(mine) or DEFAULT).guarantee.named():
        return True
    prio = owners.priority_of.get(spec.name, 0)
    return any(t == mine and owners.priority_of.get(d, 0) < prio for d, t in owners.tenant_of.items())


def admit(snap: ClusterSnapshot, spec: ModelSpec, request: Request, tenants: TenantsFile, owners: Owners,
          name: str, config: PolicyConfig | None = None) -> Admission:
    mine = owners.tenant_of.get(spec.name, "default")
    me = tenants.get(mine) or DEFAULT
    d = decide(snap, spec, request, config, exclude=name)
    slivers = d.scheduled and bool(me.guarantee.named()) and fragmented(d.placement, occupancy.of(snap).workers)
    if not me.limit.named() and not slivers and (d.scheduled or not may_preempt(spec, tenants, owners)):
        return Admission(d)  # nothing to check: no usage summed (a decision at 10,000 instances stays cheap)
    snap = without(snap, {name})  # its own reservation, if any, is neither usage nor in the way
    used = by_tenant([i for i in snap.instances if owners.tenant_of.get(i.model, "default") == mine],
                     owners.tenant_of).get(mine, Usage())
    if slivers:
        whole = _whole(snap, spec, request, tenants, owners, name, config, me, used)
        if whole is not None:
            return whole
    if d.scheduled:
        return Admission(d, quota=over_limit(me, used, of_candidate(d.placement)))
    if me.limit.named():
        empty = decide(without(snap, {i.name for i in snap.instances}), spec, request, config, exclude=name)
        if empty.scheduled:
            q = over_limit(me, used, of_candidate(empty.placement))
            if q:
                return Admission(d, quota=q)
    if not may_preempt(spec, tenants, owners):
        return Admission(d)
    p = plan(snap, spec, request, tenants, owners, name, config)
    if p.placement is not None and p.victims:  # the decision recorded is the one made without the victims
        return Admission(decide(without(snap, set(p.victims)), spec, request, config, exclude=name), preemption=p)
    if p.reasons and p.reasons[0].startswith("quota:"):
        return Admission(d, quota=p.reasons[0])
    return Admission(d, notes=[r for r in p.reasons if r.startswith("preemption:")])


def _whole(snap: ClusterSnapshot, spec: ModelSpec, request: Request, tenants: TenantsFile, owners: Owners,
           name: str, config: PolicyConfig | None, me: Tenant, used: Usage) -> Admission | None:
    """Rule 4: whole GPUs by preemption for a replica the decision put in slivers, when its tenant
    stays within its guarantee with the replica's empty-cluster shape; None when no preemption
    gives whole GPUs within the guarantee and limits (the slivers then stand)."""
    empty = decide(without(snap, {i.name for i in snap.instances}), spec, request, config, exclude=name)
    if not empty.scheduled or not within_guarantee(me, used, of_candidate(empty.placement)):
        return None
    p = plan(snap, spec, request, tenants, owners, name, config, whole_only=True)
    if p.placement is None or over_limit(me, used, of_candidate(p.placement)):
        return None
    final = decide(without(snap, set(p.victims)), spec, request, config, exclude=name, whole_only=True)
    return Admission(final, preemption=p) if p.victims else Admission(final)
