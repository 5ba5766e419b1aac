"""The decisions' tenancy (activities/decider.py): what they read from the store for
scheduler/tenancy/admit.py, and how an admission shows in the decision record the workflow keeps
(and ``gpuflow explain`` shows): the quota, the victims and why, as typed fields.

The tenant of a deployment comes from the store (its current spec), never from the instance's
copy of the spec, which can be older. Without a tenants file, every deployment is in ``default``
(no guarantee, no limit) and only deployment priorities within it can preempt."""

from __future__ import annotations

from sqlalchemy.engine import Engine
from sqlmodel import Session

from contracts.control import DecisionRecord, PlacementPlan, PreemptNotice, Victim
from store import tenants
from scheduler.cluster import ClusterSnapshot
from scheduler.spec import ModelSpec
from scheduler.tenancy.admit import Admission, may_preempt
from scheduler.tenancy.config import TenantsFile
from scheduler.tenancy.preemption import Owners


def owners_of(bind: Engine | Session, spec: ModelSpec) -> tuple[TenantsFile, Owners]:
    """(tenants file, owners); the booking times are read only when this replica could preempt."""
    tf, own = tenants.view(bind)
    o = Owners({d: x.tenant for d, x in own.items()}, {d: x.priority for d, x in own.items()}, {})
    if may_preempt(spec, tf, o):
        o = Owners(o.tenant_of, o.priority_of, tenants.booked_since(bind))
    return tf, o


def plan_of(i) -> PlacementPlan:
    return PlacementPlan(worker=i.worker, gpu_indexes=list(i.gpu_indexes), claim=i.claim,
                         subordinates=list(i.subordinates))


def amend(rec: DecisionRecord, adm: Admission, owners: Owners, snap: ClusterSnapshot, spec: ModelSpec) -> DecisionRecord:
    """The record with the tenant's verdict: a quota leads the reasons (and is the one decisive
    reason); a preemption lists its victims with what each holds; notes on why preemption did
    not help follow the decisive reasons."""
    rec.tenant = owners.tenant_of.get(spec.name, "default")
    if adm.quota:
        rec.scheduled, rec.plan, rec.placement, rec.strategy, rec.score = False, None, None, None, None
        rec.reasons = [adm.quota] + [r for r in rec.reasons if r != adm.quota]
        rec.quota, rec.decisive = adm.quota, 1
    elif adm.preemption is not None:
        held = {i.name: i for i in snap.instances}
        rec.victims = [Victim(name=v, deployment=held[v].model, tenant=owners.tenant_of.get(held[v].model, "default"),
                              plan=plan_of(held[v])) for v in adm.victims]
        rec.preempt_why = adm.preemption.why
    elif adm.notes:
        k = rec.decisive
        rec.reasons = rec.reasons[:k] + adm.notes + rec.reasons[k:]
    return rec


def notice(rec: DecisionRecord, instance: str) -> PreemptNotice:
    return PreemptNotice(by=f"{rec.tenant}/{instance}", instance=instance, why=rec.preempt_why)
