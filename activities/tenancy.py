"""The decisions' tenancy (activities/decider.py): what they read from the store for
scheduler/tenancy/admit.py. How an admission shows in the decision record the workflow keeps (the
quota, the victims and why) is contracts/decision_of.py's ``amend``.

The tenant of a deployment comes from the store (its current spec), never from the instance's
copy of the spec, which can be older. Without a tenants file, every deployment is in ``default``
(no guarantee, no limit) and only deployment priorities within it can preempt."""

from __future__ import annotations

from sqlalchemy.engine import Engine
from sqlmodel import Session

from store import tenants
from scheduler.spec import ModelSpec
from scheduler.tenancy.admit import may_preempt
from scheduler.tenancy.config import TenantsFile
from scheduler.tenancy.preemption import Owners


def owners_of(bind: Engine | Session, spec: ModelSpec) -> tuple[TenantsFile, Owners]:
    """(tenants file, owners); the booking times are read only when this replica could preempt."""
    tf, own = tenants.view(bind)
    o = Owners({d: x.tenant for d, x in own.items()}, {d: x.priority for d, x in own.items()}, {})
    if may_preempt(spec, tf, o):
        o = Owners(o.tenant_of, o.priority_of, tenants.booked_since(bind))
    return tf, o
