"""The PENDING queue as the store holds it: every PENDING replica of a live deployment, with its
deployment's spec and its tenant's priority (``read``), in the queue's order (``ordered_replicas``:
scheduler/tenancy/queue.py ``ordered``). The wake judges it (activities/wake_queue.py); the views
show it with each replica's recorded reason (views/tenancy.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

from sqlalchemy.engine import Engine
from sqlalchemy import or_
from sqlmodel import Session, select

from scheduler.tenancy.config import TenantsFile
from scheduler.tenancy.queue import Waiting, ordered
from store import tenants
from store.tables import DeploymentRow, InstanceRow


@dataclass(frozen=True)
class Queued:
    """One PENDING replica as the queue sees it."""

    instance: str
    deployment: str
    tenant: str
    tenant_priority: int
    priority: int
    queued_at: datetime
    reason: str  # its own last word (the instance's recorded reason)
    decided: bool = True  # its workflow recorded a decision (False: it was just started and decides by itself)

    def waiting(self) -> Waiting:
        return Waiting(self.instance, self.deployment, self.tenant_priority, self.priority,
                       self.queued_at.timestamp(), self.tenant)

    @property
    def level(self) -> tuple[int, int]:
        """Its priority: the tenant's, then the deployment's (higher first)."""
        return (self.tenant_priority, self.priority)


@dataclass
class Queue:
    """What the store says: the PENDING replicas, their deployments' specs, the tenants file."""

    replicas: list[Queued] = field(default_factory=list)
    specs: dict[str, dict] = field(default_factory=dict)  # deployment with replicas queued -> its spec, as stored
    tenant_of: dict[str, str] = field(default_factory=dict)  # every live deployment -> its tenant
    tenants: TenantsFile = field(default_factory=TenantsFile)


def _utc(t: datetime) -> datetime:
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)  # SQLite gives naive UTC


def read(engine: Engine) -> Queue:
    """The PENDING replicas of live deployments, with their specs and owners."""
    tf = tenants.load(engine)
    q = Queue(tenants=tf)
    with Session(engine) as s:
        rows = list(s.exec(select(InstanceRow.name, InstanceRow.deployment, InstanceRow.queued_at,
                                  InstanceRow.updated_at, InstanceRow.reason, InstanceRow.decision)
                           .where(InstanceRow.state == "pending")
                           .where(or_(InstanceRow.group_name.is_(None), InstanceRow.backend.is_not(None)))))
        # a group's members not booked yet (no backend) wait on their deployment (store/groups.py)
        deps = {r[1] for r in rows}
        live: dict[str, dict] = {}
        for d in s.exec(select(DeploymentRow).where(DeploymentRow.state == "active")):
            q.tenant_of[d.name] = tenants.tenant_of(d.spec)
            if d.name in deps:
                live[d.name] = d.spec
    for name, dep, queued_at, updated_at, reason, decision in rows:
        if dep not in live:  # being deleted (its replicas are stopping) or never recorded
            continue
        spec = live[dep]
        t = tenants.tenant_of(spec)
        known = tf.get(t)
        q.replicas.append(Queued(name, dep, t, known.priority if known else 0, _int(spec.get("priority")),
                                 _utc(queued_at or updated_at), reason or "", decision is not None))
    q.specs = live
    return q


def _int(v) -> int:
    try:
        return int(v or 0)
    except (TypeError, ValueError):
        return 0


def ordered_replicas(replicas: list[Queued]) -> list[Queued]:
    by_name = {r.instance: r for r in replicas}
    return [by_name[w.instance] for w in ordered([r.waiting() for r in replicas])]


def redeciding(engine: Engine, names: list[str]) -> set[str]:
    """Which of ``names`` wait PENDING after a decision of their own (woken to decide again), as
    opposed to replicas just started, deciding for the first time (activities/queue_gate.py)."""
    if not names:
        return set()
    with Session(engine) as s:  # the column is JSON: "no decision" may be stored as JSON null, read as None
        rows = s.exec(select(InstanceRow.name, InstanceRow.decision).where(InstanceRow.name.in_(names))
                      .where(InstanceRow.state == "pending"))
        return {name for name, decision in rows if decision is not None}
