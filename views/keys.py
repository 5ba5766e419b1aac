"""API keys and their use, as ``gpuflow keys list|usage`` and the console's keys page show them:
the control plane answers with these (activities/cluster_reads.py), ``--data-dir`` and the console
read them from the store itself."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy.engine import Engine

from contracts.cluster import KeyView, UsageCounts, UsageRow
from store import key_usage, keys


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def key_view(k: keys.KeyInfo) -> KeyView:
    return KeyView(id=k.id, tenant=k.tenant, name=k.name, created_at=_iso(k.created_at), revoked_at=_iso(k.revoked_at),
                   admin=k.admin, scope=k.scope, requests_per_s=k.requests_per_s, tokens_per_min=k.tokens_per_min,
                   max_concurrent=k.max_concurrent)


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
