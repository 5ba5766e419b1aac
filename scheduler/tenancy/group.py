"""Preemption for a group: the PENDING replicas of one deployment that are decided together (one
batch of decisions), admitted at once, so a tenant below its guarantee gets every replica the
guarantee covers in one pass, not one per wake. Kueue's fill-back, over the group.

1. Each replica, in order, is admitted (admit.py) on the snapshot as the replicas before it leave
   it: their placements booked, their victims gone. So no two replicas take the same victim, and
   the guarantee counts the replicas placed before (the last one the guarantee covers is the last
   to preempt).
2. Fill-back for the group: each victim, in the reverse of the order it was chosen, is spared when
   every replica the group placed is still placed without it, on whole GPUs, each in turn, holding
   no more than before. (Replica 1 took a 1-GPU victim, replica 2 a 2-GPU one: replica 1 fits on
   the second GPU of replica 2's victim, so the first victim is spared.) Where the file uses
   Kueue's terms, the fill-back sees what the replicas saw (admit.py rule 5): their tenant's GPU
   models, and no GPU another tenant's borrower holds.
3. Each victim is named by the replica whose GPUs it frees (the first such; a victim that frees
   none of them, by the group's first placed replica), and its drain comes first as for any
   preemption (workflows/preempt_steps.py).

Pure: the same inputs as admit(), plus the replicas' names."""

from __future__ import annotations

from scheduler.cluster import ClusterSnapshot
from scheduler.decide import decide
from scheduler.decision import Candidate, Decision
from scheduler.dry_run import book, without
from scheduler.policy_config import PolicyConfig
from scheduler.request import Request
from scheduler.spec import ModelSpec
from scheduler.tenancy import flavors, lending
from scheduler.tenancy.admit import Admission, admit, kueue_terms
from scheduler.tenancy.config import DEFAULT, TenantsFile
from scheduler.tenancy.preemption import Owners, Preemption
from scheduler.tenancy.usage import Usage, of_candidate


def _placed(a: Admission) -> bool:
    return a.decision.scheduled and a.quota is None


def _gpus(c: Candidate) -> set[tuple[str, int]]:
    return {(c.worker, i) for i in c.gpu_indexes} | {(s.worker, i) for s in c.subordinates for i in s.gpu_indexes}


def _in_turn(snap: ClusterSnapshot, spec: ModelSpec, request: Request, config: PolicyConfig | None,
             names: list[str], gone: set[str], view=None) -> list[Decision] | None:
    """Each of ``names`` decided in turn on ``snap`` without ``gone``, on whole GPUs, each booked
    before the next; None when one does not fit. ``view``: what the decisions see (_fill_view)."""
    s, out = without(snap, gone), []
    for n in names:
        d = decide(view(s) if view else s, spec, request, config, exclude=n, whole_only=True)
        if not d.scheduled:
            return None
        out.append(d)
        s = book(s, d.placement, n, spec.name)
    return out


def _total(cands) -> Usage:
    return sum((of_candidate(c) for c in cands), Usage())


def admit_group(snap: ClusterSnapshot, spec: ModelSpec, request: Request, tenants: TenantsFile, owners: Owners,
                names: list[str], config: PolicyConfig | None = None) -> list[Admission]:
    """The admission of each of ``names`` (replicas of ``spec``, in queue order), the group's
    victims minimal together."""
    adms, s = [], without(snap, set(names))
    for n in names:
        a = admit(s, spec, request, tenants, owners, n, config)
        adms.append(a)
        if _placed(a):
            s = book(without(s, set(a.victims)), a.decision.placement, n, spec.name)
    victims = [v for a in adms for v in a.victims]
    placed = [n for n, a in zip(names, adms) if _placed(a)]
    if len(victims) < 2 or len(placed) < 2:
        return adms
    base, before = without(snap, set(names)), _total(a.decision.placement for a in adms if _placed(a))
    view = _fill_view(base, spec, tenants, owners) if kueue_terms(tenants) else None
    keep = list(victims)
    for v in reversed(victims):
        trial = [x for x in keep if x != v]
        got = _in_turn(base, spec, request, config, placed, set(trial), view)
        if got is not None and all(getattr(_total(d.placement for d in got), r) <= getattr(before, r)
                                   for r in ("gpus", "vram", "ram")):
            keep = trial
    if keep == victims:
        return adms
    final = _in_turn(base, spec, request, config, placed, set(keep), view)
    return _named(adms, names, placed, final, keep, snap, owners, spec)


def _fill_view(base: ClusterSnapshot, spec: ModelSpec, tenants: TenantsFile, owners: Owners):
    """What the fill-back's decisions see (admit.py rule 5, for replicas that reclaim): the
    tenant's GPU models, without GPUs other tenants' borrowers hold."""
    mine = owners.tenant_of.get(spec.name, "default")
    me = tenants.get(mine) or DEFAULT
    kept = lending.guaranteed(base, tenants, owners.tenant_of, owners.started_at)
    hidden = {i.name for i in base.instances if i.worker is not None
              and owners.tenant_of.get(i.model, "default") != mine} - kept
    return lambda s: lending.hide(flavors.restrict(s, me), lending.gpus_of(s, hidden))


def _named(adms: list[Admission], names: list[str], placed: list[str], final: list[Decision], keep: list[str],
           snap: ClusterSnapshot, owners: Owners, spec: ModelSpec) -> list[Admission]:
    """Step 3: each kept victim named by the replica whose GPUs it frees."""
    held = {i.name: i for i in snap.instances}
    frees = {v: {(held[v].worker, g) for g in held[v].gpu_indexes}
             | {(x.worker, g) for x in held[v].subordinates for g in x.gpu_indexes} for v in keep}
    mine = owners.tenant_of.get(spec.name, "default")
    by_name, left = {}, list(keep)
    for n, d in zip(placed, final):
        taken = [v for v in left if frees[v] & _gpus(d.placement)]
        left = [v for v in left if v not in taken]
        by_name[n] = (d, taken)
    if left:  # frees none of the group's GPUs (RAM only): named by the first placed replica
        d, taken = by_name[placed[0]]
        by_name[placed[0]] = (d, taken + left)
    out = []
    for n, a in zip(names, adms):
        if n not in by_name:
            out.append(a)
            continue
        d, taken = by_name[n]
        if not taken:
            out.append(Admission(d))
            continue
        cross = any(owners.tenant_of.get(held[v].model, "default") != mine for v in taken)
        why = f"to reclaim {mine}'s guarantee" if cross else "for a higher-priority deployment of its tenant"
        out.append(Admission(d, preemption=Preemption(d.placement, victims=taken, reasons=d.reasons, why=why)))
    return out
