"""The PENDING queue, the tenants' use and the recent preemptions, read from the store: what
``gpuflow queue`` and ``tenants`` show (through the control plane, which answers with these rows:
activities/cluster_reads.py; or offline with --data-dir/--database-url) and the web console's
queue and tenants pages. The queue's reasons are the store's, as the control plane's verdicts wrote
them (activities/pending_reasons.py): the same text everywhere."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from scheduler.estimate import estimate_request, states_resources
from scheduler.policy_config import PolicyConfig
from scheduler.tenancy.admission import borrowing
from scheduler.tenancy.config import RESOURCES, Tenant, TenantsFile
from scheduler.tenancy.usage import Usage
from store import tenants as tenant_store
from store.decision_log import DecisionRow, record_of
from store.pending_queue import ordered_replicas, read

PREEMPTIONS = 20  # the newest shown by default


def tenant_rows(tf: TenantsFile, used: dict[str, Usage], pending: dict[str, int]) -> list[dict]:
    """One line per tenant (the file's, then ``default``, then any holding capacity unnamed)."""
    names = [t.name for t in tf.tenants] + sorted(({"default"} | set(used) | set(pending)) - {t.name for t in tf.tenants})
    out = []
    for n in names:
        t: Tenant = tf.get(n) or Tenant(name=n)
        u = used.get(n, Usage())
        g = t.guaranteed()  # as named, else the flavors' summed
        out.append({"tenant": n, "priority": t.priority, "borrowing": borrowing(t, u) and bool(g),
                    "pending": pending.get(n, 0), "cohort": t.cohort, "flavors": sorted(t.flavors or {}),
                    "requests_per_s": t.requests_per_s, "max_concurrent": t.max_concurrent,
                    **{r: {"used": getattr(u, r), "guarantee": g.get(r), "limit": getattr(t.limit, r)}
                       for r in RESOURCES}})
    return out


def queue_rows(order: list, reason_of: Callable[[Any], str], now: datetime) -> list[dict]:
    """The queue's lines in ``order``: position, who, how long it has waited and why
    (``reason_of``: the one reason, activities/pending_reasons.py)."""
    return [{"position": pos, "instance": r.instance, "tenant": r.tenant, "tenant_priority": r.tenant_priority,
             "priority": r.priority, "deployment": r.deployment, "queued_at": r.queued_at.isoformat(),
             "waiting_s": round(max(0.0, (now - r.queued_at).total_seconds()), 1), "reason": reason_of(r) or "-"}
            for pos, r in enumerate(order, 1)]


def stored_queue(engine: Engine, now: datetime) -> tuple[str, list[dict]]:
    """The queue in order with each replica's reason as the store holds it: the console's queue
    page and ``gpuflow queue --data-dir`` (a judgement is the control plane's to make and record)."""
    q = read(engine)
    return q.tenants.queueing, queue_rows(ordered_replicas(q.replicas), lambda r: r.reason, now)


def stated(spec):
    """A spec's request where the spec states its resources (nothing to read); else None: unknown here."""
    return estimate_request(spec) if states_resources(spec) else None


def queue(engine: Engine, policy: PolicyConfig | None = None, now: datetime | None = None) -> tuple[str, list[dict]]:
    """(the queueing mode, the PENDING queue's rows in the order the next wake sees it, each with
    the reason the store holds: the one that status, explain and the console's replica page show,
    written by the control plane's verdicts, activities/pending_reasons.py). ``policy`` is unused:
    nothing is judged here."""
    return stored_queue(engine, now or datetime.now(timezone.utc))


def tenants(engine: Engine) -> tuple[str, list[dict]]:
    """(the queueing mode, one row per tenant: its use against its guarantee and limit)."""
    have = tenant_store.load(engine)
    return have.queueing, tenant_rows(have, tenant_store.usage(engine), tenant_store.pending_by_tenant(engine))


@dataclass(frozen=True)
class Preemption:
    at: datetime
    instance: str  # the preemptor
    deployment: str
    tenant: str
    victims: list[dict]  # {name, deployment, tenant}
    why: str


def preemptions(engine: Engine, limit: int = PREEMPTIONS) -> list[Preemption]:
    """The newest ``limit`` preemptions, newest first: the kept decisions that preempted
    (store/decision_log.py, outcome 'preempting'), each with its victims and the policy's why.
    Only kept decisions are seen (GPUFLOW_DECISION_RETENTION_DAYS=0 keeps none)."""
    with Session(engine) as s:
        rows = list(s.exec(select(DecisionRow).where(DecisionRow.kind == "placement",
                                                     DecisionRow.outcome == "preempting")
                           .order_by(DecisionRow.id.desc()).limit(limit)))
    out = []
    for r in rows:
        try:
            rec = record_of(r)
        except (zlib.error, ValueError):  # a damaged record: still a preemption, its details unknown
            rec = {}
        victims = [{k: str(v.get(k, "")) for k in ("name", "deployment", "tenant")}
                   for v in rec.get("victims") or [] if isinstance(v, dict)]
        out.append(Preemption(at=r.at, instance=r.instance, deployment=r.deployment,
                              tenant=str(rec.get("tenant") or "default"), victims=victims,
                              why=str(rec.get("preempt_why") or "")))
    return out
