"""What the cluster workflow's reads and the tenants file's apply do in the store, one function
each, in blocking code: the control plane's activities run them (activities/cluster.py) and so
do the CLI's offline commands (``--data-dir``/``--database-url``), so a page reads the same
either way.

A read answers one page of rows (contracts/cluster.py ``Page``, at most ``PAGE_MAX``) and the
total: an answer stays small in the history whatever the cluster's size, and the CLI asks page
after page."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Callable

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from activities.wake_queue import judge_and_record, ordered_replicas, read, shown
from contracts.cluster import (KeysPage, KeyView, Page, QueuePage, ServingAsk, ServingView, TenantsApplied, TenantsPage,
                                UsageCounts, UsagePage, UsageRow)
from store import key_usage, keys, serving, tenants
from store.snapshot import load_snapshot
from store.tables import InstanceRow, utcnow
from scheduler.policy_config import PolicyConfig
from scheduler.request import Request
from scheduler.spec import ModelSpec
from scheduler.tenancy.admission import borrowing
from scheduler.tenancy.config import RESOURCES, Tenant, TenantsFile
from scheduler.tenancy.usage import Usage

RequestOf = Callable[[ModelSpec], Request | None]


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def key_view(k: keys.KeyInfo) -> KeyView:
    return KeyView(id=k.id, tenant=k.tenant, name=k.name, created_at=_iso(k.created_at), revoked_at=_iso(k.revoked_at),
                   admin=k.admin, scope=k.scope)


def keys_page(engine: Engine, page: Page) -> KeysPage:
    return KeysPage(keys=[key_view(k) for k in keys.list_keys(engine, page.offset, page.limit)], total=keys.count(engine))


def usage_rows(hour: key_usage.Totals, day: key_usage.Totals) -> list[UsageRow]:
    """Each tenant with use in the day (``day`` holds the hour's too): its total, then its keys."""
    def counts(c: key_usage.Counts | None) -> UsageCounts:
        return UsageCounts(**vars(c)) if c else UsageCounts()
    out = []
    for t in sorted(day.by_tenant):
        out.append(UsageRow(tenant=t, hour=counts(hour.by_tenant.get(t)), day=counts(day.by_tenant[t])))
        out += [UsageRow(tenant=t, key_id=k, hour=counts(hour.by_key.get(k)), day=counts(day.by_key[k]))
                for k in sorted(k for k, kt in day.key_tenant.items() if kt == t)]
    return out


def key_usage_rows(engine: Engine, now: datetime) -> list[UsageRow]:
    """Requests and tokens per tenant and per key over the last hour and the last day."""
    return usage_rows(key_usage.totals(engine, now - timedelta(hours=1), now),
                      key_usage.totals(engine, now - timedelta(days=1), now))


def key_usage_page(engine: Engine, page: Page, now: datetime) -> UsagePage:
    rows = key_usage_rows(engine, now)
    return UsagePage(rows=rows[page.offset:page.offset + page.limit], total=len(rows))


def tenant_rows(tf: TenantsFile, used: dict[str, Usage], pending: dict[str, int]) -> list[dict]:
    """One line per tenant (the file's, then ``default``, then any holding capacity unnamed)."""
    names = [t.name for t in tf.tenants] + sorted(({"default"} | set(used) | set(pending)) - {t.name for t in tf.tenants})
    out = []
    for n in names:
        t: Tenant = tf.get(n) or Tenant(name=n)
        u = used.get(n, Usage())
        out.append({"tenant": n, "priority": t.priority, "borrowing": borrowing(t, u) and bool(t.guarantee.named()),
                    "pending": pending.get(n, 0),
                    "requests_per_s": t.requests_per_s, "max_concurrent": t.max_concurrent,
                    **{r: {"used": getattr(u, r), "guarantee": getattr(t.guarantee, r), "limit": getattr(t.limit, r)}
                       for r in RESOURCES}})
    return out


def tenants_page(engine: Engine, page: Page) -> TenantsPage:
    tf = tenants.load(engine)
    rows = tenant_rows(tf, tenants.usage(engine), tenants.pending_by_tenant(engine))
    return TenantsPage(queueing=tf.queueing, rows=rows[page.offset:page.offset + page.limit], total=len(rows))


def apply_tenants(engine: Engine, tf: TenantsFile, request_of: RequestOf, policy: PolicyConfig | None) -> TenantsApplied:
    """Store ``tf`` (store/tenants.py ``apply``: whole, or refused naming the problem), then give
    the PENDING replicas their reasons under it (activities/wake_queue.judge_and_record), for the
    specs ``request_of`` can cost; a spec it cannot keeps its own until its next wake."""
    v = tenants.apply(engine, tf)
    moved = judge_and_record(engine, load_snapshot(engine), request_of, policy)[1]
    names = [t.name for t in tf.tenants]
    return TenantsApplied(version=v, tenants=names[:20], count=len(names), queueing=tf.queueing, reasons=moved)


def queue_rows(order: list, reason_of: Callable[[Any], str], now: datetime) -> list[dict]:
    """The queue's lines in ``order``: position, who, how long it has waited and why
    (``reason_of``: the one reason, activities/pending_reasons.py)."""
    return [{"position": pos, "instance": r.instance, "tenant": r.tenant, "tenant_priority": r.tenant_priority,
             "priority": r.priority, "deployment": r.deployment, "queued_at": r.queued_at.isoformat(),
             "waiting_s": round(max(0.0, (now - r.queued_at).total_seconds()), 1), "reason": reason_of(r) or "-"}
            for pos, r in enumerate(order, 1)]


def queue_page(engine: Engine, page: Page, request_of: RequestOf, policy: PolicyConfig | None,
               now: datetime) -> QueuePage:
    """``gpuflow queue``: the queue judged on a fresh snapshot, its reasons recorded as a wake
    records them, and shown as recorded: what status, explain and the console show next."""
    v = judge_and_record(engine, load_snapshot(engine), request_of, policy)[0]
    rows = queue_rows(v.order, lambda r: shown(r, v), now)
    return QueuePage(queueing=tenants.load(engine).queueing, rows=rows[page.offset:page.offset + page.limit],
                     total=len(rows))


def stored_queue(engine: Engine, now: datetime) -> tuple[str, list[dict]]:
    """The queue in order with each replica's reason as the store holds it: the console's queue
    page and ``gpuflow queue --data-dir`` (a judgement is the control plane's to make and record)."""
    q = read(engine)
    return q.tenants.queueing, queue_rows(ordered_replicas(q.replicas), lambda r: r.reason, now)


def serving_view(engine: Engine, ask: ServingAsk, live_s: float = serving.LIVE_S) -> ServingView:
    """The live gateways, what they have in flight on each instance ``ask`` names (those with
    none are left out), and the store's reason of each of them that is PENDING."""
    since = utcnow() - timedelta(seconds=live_s)
    names = list(dict.fromkeys(ask.instances))
    with Session(engine) as s:
        gateways = [g.url for g in s.exec(select(serving.GatewayRow).where(serving.GatewayRow.updated_at >= since)
                                          .order_by(serving.GatewayRow.id))]
        flying = serving.in_flight_of(s, names, since)
        reasons = s.exec(select(InstanceRow.name, InstanceRow.reason)
                         .where(InstanceRow.name.in_(names), InstanceRow.state == "pending")).all() if names else []
    return ServingView(gateways=gateways, in_flight=flying,
                       reasons={n: r for n, r in reasons if r})
