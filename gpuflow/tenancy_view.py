"""The PENDING queue, the tenants' use and the recent preemptions, read from the store itself:
``gpuflow queue``/``tenants`` with --data-dir/--database-url, and the web console (which reads the
store rather than ask the cluster workflow: a page refreshed every few seconds would otherwise
grow that workflow's history by an update each time). The queue's reasons are the store's, as the
control plane's verdicts wrote them (activities/pending_reasons.py): the same text everywhere."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from activities.cluster_reads import stored_queue, tenant_rows
from scheduler.estimate import estimate_request, states_resources
from scheduler.policy_config import PolicyConfig
from store import tenants as tenant_store
from store.decision_log import DecisionRow, record_of

PREEMPTIONS = 20  # the newest shown by default


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
