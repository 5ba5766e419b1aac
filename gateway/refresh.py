"""Off the request path: every ``refresh_s`` the gateway re-reads the routing table from the
store (RUNNING instances and the active deployments' specs), swaps it in whole, and reports its
in-flight counts (``serving.report_load``) so that a drain knows when a replica is idle.

Why store polling: the store is already the queryable projection of every instance workflow
(each state change is written there by an activity before it takes effect), every gateway can
read it with no Temporal connection, and a half-second poll of two small indexed tables meets the
2 s bound with room to spare; a Temporal query per deployment would cost more per poll and a
signal fan-out would need every gateway registered with every workflow.

The same loop reads the tenants file's version (one row) and re-reads the file only when it
moved, for the per-tenant limits and priorities (tenant_limits.py); a file applied with
``gpuflow tenants apply`` takes effect within one ``refresh_s``."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from store import db, gateway_demand, keys, pd_counts, serving, tenants
from store.tables import DeploymentRow
from gateway import table as tables
from gateway.tenant_limits import Rule, rules_of

log = logging.getLogger("gpuflow.gateway")


def load(engine: Engine, default_limit: int) -> tuple[tables.Table, bool]:
    """The routing table and whether any API key exists, read from the store."""
    with Session(engine) as s:
        specs = {d.name: d.spec or {} for d in s.exec(select(DeploymentRow).where(DeploymentRow.state == "active"))}
    return (tables.build(serving.routes(engine), specs, default_limit, members=serving.group_members(engine)),
            keys.any_key(engine))


def load_tenants(engine: Engine, known: int | None) -> tuple[int, dict[str, Rule]] | None:
    """The tenants file's version and the gateway's rules from it; None when the version is
    still ``known`` (nothing to parse)."""
    if tenants.version(engine) == known:
        return None
    applied = tenants.read(engine)
    return applied.version, rules_of(applied.file)


class Refresher:
    def __init__(self, gw):
        self.gw = gw
        self.loaded_at: float | None = None  # monotonic time of the last good read
        self.failing_since: float | None = None
        self.tenants_version: int | None = None  # of the tenants file the limits come from
        self.tenants_failing = False
        self.demand_at: float | None = None  # monotonic time of the last demand report
        self.shares_failing = False

    async def once(self) -> None:
        gw = self.gw
        try:
            table, any_key = await asyncio.to_thread(load, db.reader(gw.engine), gw.settings.max_concurrency)
        except Exception as e:  # noqa: BLE001  a store outage keeps the last table; /healthz says so
            if self.failing_since is None:
                self.failing_since = time.monotonic()
                log.warning("gateway: cannot read the routing table (%s); serving the last one", e)
        else:
            if table != gw.balancer.table:
                gw.balancer.swap(table)
                gw.caches.on_table(table)  # engines' cache sizes and KV events (gateway/cache_watch.py)
            gw.auth.required = any_key
            self.loaded_at, self.failing_since = time.monotonic(), None
        try:
            got = await asyncio.to_thread(load_tenants, db.reader(gw.engine), self.tenants_version)
        except Exception as e:  # noqa: BLE001  the last limits stay
            if not self.tenants_failing:
                log.warning("gateway: cannot read the tenants file (%s); keeping the last limits", e)
            self.tenants_failing = True
        else:
            self.tenants_failing = False
            if got is not None:
                self.tenants_version = got[0]
                gw.limits.set_rules(got[1], time.monotonic())
        await self.shares()
        gw.balancer.tick()
        await gw.usage.flush(gw.engine, gw.settings.gateway_id, time.time())
        for name in gw.balancer.table.models:
            gw.metrics.queue_depth.labels(name).set(gw.balancer.depth(name))
        try:
            await asyncio.to_thread(serving.report_load, gw.engine, gw.settings.gateway_id, gw.settings.url,
                                    dict(gw.balancer.in_flight))
        except Exception as e:  # noqa: BLE001
            log.warning("gateway: cannot report in-flight counts (%s)", e)
        # each group's paths, from this gateway's start (zeros too: a first sample is the judgement's baseline);
        # pd_ineffective is judged from them (store/pd_counts.py, scheduler/groups/pd_health.py)
        counts = {n: replace(gw.metrics.pd_counts.get(n) or pd_counts.PDCounts())
                  for n, m in gw.balancer.table.models.items() if m.pd is not None}
        if counts:
            try:
                await asyncio.to_thread(pd_counts.report, gw.engine, gw.settings.gateway_id, counts)
            except Exception as e:  # noqa: BLE001
                log.warning("gateway: cannot report prefill/decode counts (%s)", e)

    async def shares(self) -> None:
        """Report this gateway's demand and take its share of every limit (store/gateway_demand.py);
        when the store cannot be read, the last shares stay."""
        gw, now = self.gw, time.monotonic()
        demand = gw.limits.demand(now - self.demand_at if self.demand_at is not None else 0.0)
        self.demand_at = now
        try:
            rows = await asyncio.to_thread(gateway_demand.exchange, gw.engine, gw.settings.gateway_id, demand)
            gw.limits.set_shares(rows, time.monotonic())
        except Exception as e:  # noqa: BLE001  the store, or rows no share can be made of: the last shares stay
            if not self.shares_failing:
                log.warning("gateway: cannot exchange limit demand (%s); keeping the last shares", e)
            self.shares_failing = True
        else:
            self.shares_failing = False

    async def run(self) -> None:
        while True:
            await self.once()
            await asyncio.sleep(self.gw.settings.refresh_s)

    def forget(self) -> None:
        try:
            serving.forget_gateway(self.gw.engine, self.gw.settings.gateway_id)
            gateway_demand.forget(self.gw.engine, self.gw.settings.gateway_id)
        except Exception as e:  # noqa: BLE001
            log.warning("gateway: cannot remove its in-flight rows (%s); they expire in %g s", e, serving.LIVE_S)
