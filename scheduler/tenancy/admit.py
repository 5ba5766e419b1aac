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

5. Kueue's terms (lending.py, flavors.py), when the file uses them or names a guarantee: the
   decision sees only the GPU models the tenant's flavors allow; a replica of a tenant that stays
   within its guarantee with it (its empty-cluster shape; a tenant with unused flavor guarantees:
   on those flavors, where it is then placed) does not see GPUs other tenants' borrowers hold (it takes them by preemption; where no preemption gives room, it is placed as
   before), and a borrowing replica does not see GPUs other tenants' guaranteed replicas hold
   (lending.guaranteed: in name order within the guarantee), and tries its cohort's unused
   flavors first (``lending.tiers``). A borrower that would leave less free than other tenants
   keep by their lending limits stays PENDING with that quota reason.

What the tenant uses never counts the replica itself: it may hold a reservation (or an assumed
placement) while it decides again."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from scheduler import occupancy
from scheduler.cluster import ClusterSnapshot
from scheduler.decide import decide
from scheduler.decision import Decision
from scheduler.dry_run import book, without
from scheduler.policy_config import PolicyConfig
from scheduler.request import Request
from scheduler.spec import ModelSpec
from scheduler.scorers.fragmentation import fragmented
from scheduler.tenancy import flavors, lending
from scheduler.tenancy.admission import over_limit, within_guarantee
from scheduler.tenancy.config import DEFAULT, Tenant, TenantsFile
from scheduler.tenancy.preemption import Owners, Preemption, plan
from scheduler.tenancy.usage import Usage, by_tenant, of_candidate, of_instance


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
    if (tenants.get(mine) or DEFAULT).guaranteed():
        return True
    prio = owners.priority_of.get(spec.name, 0)
    return any(t == mine and owners.priority_of.get(d, 0) < prio for d, t in owners.tenant_of.items())


def kueue_terms(tenants: TenantsFile) -> bool:
    """Whether admission must look at other tenants (rule 5): a guarantee, a cohort, a lending
    limit or flavors anywhere in the file."""
    return any(t.guaranteed() or t.cohort or t.lending_limit or t.flavors for t in tenants.tenants)


@dataclass
class _Ctx:
    """Rule 5's inputs for one replica: its tenant's use (overall, per flavor), every tenant's, the
    GPU names, whether it borrows and what its decisions see."""

    used: Usage
    fused: dict[str, Usage]
    all_used: dict[str, Usage]
    all_fused: dict[str, dict[str, Usage]]
    names: dict[tuple[str, int], str]
    borrower: bool
    view: Callable[[ClusterSnapshot], ClusterSnapshot]
    tiers: list
    bad: set = field(default_factory=set)  # the GPUs the view hides: (worker, index)
    own: set[str] | None = None  # within a flavor's guarantee: only these flavors
    me: Tenant = DEFAULT

    @property
    def hidden(self) -> int:
        return len(self.bad)

    def clean(self, x) -> bool:
        """Whether placement ``x`` is one the view allows (then deciding on the view is not needed)."""
        gpus = [(x.worker, i) for i in x.gpu_indexes] + [(sub.worker, i) for sub in x.subordinates for i in sub.gpu_indexes]
        if any(g in self.bad for g in gpus):
            return False
        return not self.own or all(flavors.flavor_of(self.me, self.names.get(g, "")) in self.own for g in gpus)


def _context(snap: ClusterSnapshot, spec: ModelSpec, request: Request, tenants: TenantsFile, owners: Owners,
             name: str, config: PolicyConfig | None, me: Tenant, mine: str) -> _Ctx:
    snap = without(snap, {name})
    per = {i.name: of_instance(i) for i in snap.instances if i.worker is not None}  # summed once, used twice
    all_used: dict[str, Usage] = {}
    for i in snap.instances:
        if i.name in per:
            t = owners.tenant_of.get(i.model, "default")
            all_used[t] = all_used.get(t, Usage()) + per[i.name]
    names = flavors.gpu_names(snap) if any(t.flavors for t in tenants.tenants) else {}
    all_fused = {t.name: flavors.used_by(t, [i for i in snap.instances
                                             if owners.tenant_of.get(i.model, "default") == t.name], names)
                 for t in tenants.tenants if t.flavors}
    used, fused = all_used.get(mine, Usage()), all_fused.get(mine, {})
    borrower, own = True, None
    if me.guaranteed():  # its own unused flavors first (Kueue tries a queue's flavors in order)
        own = lending.unused_flavors(me, fused, lent=False) if me.flavors else None
        empty = without(snap, {i.name for i in snap.instances})
        probe = decide(flavors.only(empty, me, own) if own else empty, spec, request, config, exclude=name)
        borrower = not probe.scheduled or not within_guarantee(
            me, used, of_candidate(probe.placement), fused, flavors.held(me, probe.placement, names) if me.flavors else None)
    kept = lending.guaranteed(snap, tenants, owners.tenant_of, owners.started_at, per)
    theirs = {i.name for i in snap.instances if i.worker is not None and owners.tenant_of.get(i.model, "default") != mine}
    hidden = theirs & kept if borrower else theirs - kept  # another tenant's guaranteed replicas | borrowers
    if borrower or not own:
        view = lambda s: lending.hide(s, lending.gpus_of(s, hidden))  # noqa: E731
    else:  # within a flavor's guarantee: on that flavor's GPUs
        view = lambda s: lending.hide(flavors.only(s, me, own), lending.gpus_of(s, hidden))  # noqa: E731
    tiers = lending.tiers(me, tenants, all_fused) if borrower else []
    return _Ctx(used, fused, all_used, all_fused, names, borrower, view, tiers, lending.gpus_of(snap, hidden),
                None if borrower else own, me)


def _flavored(tenants: TenantsFile) -> bool:
    """Flavors or lending limits anywhere: every decision needs rule 5's context (tiers, the kept)."""
    return any(t.flavors or t.lending_limit for t in tenants.tenants)


def _alone(snap: ClusterSnapshot, x, name: str) -> bool:
    """Whether placement ``x`` holds only GPUs no other replica holds (no GPU to keep whole)."""
    gpus = {(x.worker, i) for i in x.gpu_indexes} | {(sub.worker, i) for sub in x.subordinates for i in sub.gpu_indexes}
    return not any(i.name != name and i.worker is not None and gpus & lending.gpus_of_one(i) for i in snap.instances)


def _first(snap: ClusterSnapshot, spec: ModelSpec, request: Request, config: PolicyConfig | None, name: str,
           c: _Ctx, d: Decision) -> Decision:
    """The decision on what the replica sees, its cohort's flavors first (rule 5); ``d``: the one
    on the whole snapshot (its occupancy is cached), kept when the view allows it."""
    if not c.tiers:
        if not d.scheduled or c.clean(d.placement):  # hiding GPUs never places what did not fit
            return d
    seen = c.view(snap)
    for keep in c.tiers:
        d = decide(flavors.keep_gpus(seen, keep), spec, request, config, exclude=name, whole_only=True)
        if d.scheduled:  # slivers of a preferred flavor do not beat whole GPUs of another
            return d
    return decide(seen, spec, request, config, exclude=name)


def admit(snap: ClusterSnapshot, spec: ModelSpec, request: Request, tenants: TenantsFile, owners: Owners,
          name: str, config: PolicyConfig | None = None) -> Admission:
    mine = owners.tenant_of.get(spec.name, "default")
    me = tenants.get(mine) or DEFAULT
    snap = flavors.restrict(snap, me)
    d = decide(snap, spec, request, config, exclude=name)
    c = None
    if kueue_terms(tenants) and not (d.scheduled and _alone(snap, d.placement, name) and not _flavored(tenants)):
        c = _context(snap, spec, request, tenants, owners, name, config, me, mine)
        d = _first(snap, spec, request, config, name, c, d)
    slivers = d.scheduled and bool(me.guaranteed()) and fragmented(d.placement, occupancy.of(snap).workers)
    if c is None and not me.limit.named() and not slivers and (d.scheduled or not may_preempt(spec, tenants, owners)):
        return Admission(d)  # nothing to check: no usage summed (a decision at 10,000 instances stays cheap)
    snap = without(snap, {name})  # its own reservation, if any, is neither usage nor in the way
    if c is not None:
        used, fl = c.used, (lambda x: (c.fused, flavors.held(me, x, c.names) if me.flavors else None))
    else:
        used = by_tenant([i for i in snap.instances if owners.tenant_of.get(i.model, "default") == mine],
                         owners.tenant_of).get(mine, Usage())
        fl = lambda x: (None, None)  # noqa: E731
    view = c.view if c is not None else None
    if slivers:
        whole = _whole(snap, spec, request, tenants, owners, name, config, me, used, view, fl)
        if whole is not None:
            return whole
    if d.scheduled:
        q = over_limit(me, used, of_candidate(d.placement), *fl(d.placement))
        if q is None and c is not None and c.borrower:
            q = lending.lending_problem(book(snap, d.placement, name, spec.name), me, tenants, c.all_used, c.all_fused)
        return Admission(d, quota=q)
    if me.limit.named() or me.flavors:
        empty = decide(without(snap, {i.name for i in snap.instances}), spec, request, config, exclude=name)
        if empty.scheduled:
            q = over_limit(me, used, of_candidate(empty.placement), *fl(empty.placement))
            if q:
                return Admission(d, quota=q)
    if not may_preempt(spec, tenants, owners):
        return _as_before(snap, spec, request, config, name, c) or Admission(d, notes=_hidden_note(c))
    p = plan(snap, spec, request, tenants, owners, name, config, view=view, flavored=fl)
    if p.placement is not None and p.victims:  # the decision recorded is the one made without the victims
        final = decide(lending_seen(without(snap, set(p.victims)), view), spec, request, config, exclude=name)
        return Admission(final, preemption=p)
    if p.reasons and p.reasons[0].startswith("quota:"):
        return Admission(d, quota=p.reasons[0])
    return _as_before(snap, spec, request, config, name, c) or Admission(
        d, notes=[r for r in p.reasons if r.startswith("preemption:")] + _hidden_note(c))


def _hidden_note(c: _Ctx | None) -> list[str]:
    """Why a borrower did not see some GPUs (rule 5), when it did not fit."""
    if c is None or not c.borrower or not c.hidden:
        return []
    return [f"tenancy: {c.hidden} GPU(s) hold other tenants' guaranteed replicas; a borrowing replica does not "
            "share them"]


def lending_seen(snap: ClusterSnapshot, view) -> ClusterSnapshot:
    return view(snap) if view is not None else snap


def _as_before(snap: ClusterSnapshot, spec: ModelSpec, request: Request, config: PolicyConfig | None, name: str,
               c: _Ctx | None) -> Admission | None:
    """A guaranteed replica that no preemption gives GPUs free of borrowers: placed as before rule
    5 (it may then share a GPU with one), rather than kept waiting beside free capacity. None
    for a borrower, or when that does not place it either."""
    if c is None or c.borrower:
        return None
    again = decide(snap, spec, request, config, exclude=name)
    return Admission(again) if again.scheduled else None


def _whole(snap: ClusterSnapshot, spec: ModelSpec, request: Request, tenants: TenantsFile, owners: Owners,
           name: str, config: PolicyConfig | None, me: Tenant, used: Usage, view=None, fl=None) -> Admission | None:
    """Rule 4: whole GPUs by preemption for a replica the decision put in slivers, when its tenant
    stays within its guarantee with the replica's empty-cluster shape; None when no preemption
    gives whole GPUs within the guarantee and limits (the slivers then stand)."""
    fl = fl or (lambda x: (None, None))
    empty = decide(without(snap, {i.name for i in snap.instances}), spec, request, config, exclude=name)
    if not empty.scheduled or not within_guarantee(me, used, of_candidate(empty.placement), *fl(empty.placement)):
        return None
    p = plan(snap, spec, request, tenants, owners, name, config, whole_only=True, view=view, flavored=fl)
    if p.placement is None or over_limit(me, used, of_candidate(p.placement), *fl(p.placement)):
        return None
    final = decide(lending_seen(without(snap, set(p.victims)), view), spec, request, config, exclude=name,
                   whole_only=True)
    return Admission(final, preemption=p) if p.victims else Admission(final)
