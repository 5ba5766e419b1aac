"""Off the request path: every ``refresh_s`` the gateway re-reads the routing table from the
store (RUNNING instances and the active deployments' specs), swaps it in whole, and reports its
in-flight counts (``serving.report_load``) so that a drain knows when a replica is idle.

Why store polling: the store is already the queryable projection of every instance workflow
(each state change is written there by an activity before it takes effect), every gateway can
read it with no Temporal connection, and a half-second poll of two small indexed tables meets the
2 s bound with room to spare; a Temporal query per deployment would cost more per poll and a
signal fan-out would need every gateway registered with every workflow."""

from __future__ import annotations

import asyncio
import logging
import time

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from activities.store import keys, serving
from activities.store.tables import DeploymentRow
from gateway import table as tables

log = logging.getLogger("gpuflow.gateway")


def load(engine: Engine, default_limit: int) -> tuple[tables.Table, bool]:
    """The routing table and whether any API key exists, read from the store."""
    with Session(engine) as s:
        specs = {d.name: d.spec or {} for d in s.exec(select(DeploymentRow).where(DeploymentRow.state == "active"))}
    return tables.build(serving.routes(engine), specs, default_limit), keys.any_key(engine)


class Refresher:
    def __init__(self, gw):
        self.gw = gw
        self.loaded_at: float | None = None  # monotonic time of the last good read
        self.failing_since: float | None = None

    async def once(self) -> None:
        gw = self.gw
        try:
            table, any_key = await asyncio.to_thread(load, gw.engine, gw.settings.max_concurrency)
        except Exception as e:  # noqa: BLE001  a store outage keeps the last table; /healthz says so
            if self.failing_since is None:
                self.failing_since = time.monotonic()
                log.warning("gateway: cannot read the routing table (%s); serving the last one", e)
        else:
            if table != gw.balancer.table:
                gw.balancer.swap(table)
            gw.auth.required = any_key
            self.loaded_at, self.failing_since = time.monotonic(), None
        gw.balancer.tick()
        for name in gw.balancer.table.models:
            gw.metrics.queue_depth.labels(name).set(gw.balancer.depth(name))
        try:
            await asyncio.to_thread(serving.report_load, gw.engine, gw.settings.gateway_id, gw.settings.url,
                                    dict(gw.balancer.in_flight))
        except Exception as e:  # noqa: BLE001
            log.warning("gateway: cannot report in-flight counts (%s)", e)

    async def run(self) -> None:
        while True:
            await self.once()
            await asyncio.sleep(self.gw.settings.refresh_s)

    def forget(self) -> None:
        try:
            serving.forget_gateway(self.gw.engine, self.gw.settings.gateway_id)
        except Exception as e:  # noqa: BLE001
            log.warning("gateway: cannot remove its in-flight rows (%s); they expire in %g s", e, serving.LIVE_S)
