"""The deployment workflow's check of a prefill/decode group (issue 35, contracts/pd_health.py):
read each RUNNING decode's ``/metrics`` (its own witness of where its prefills' KV came from:
scheduler/groups/pd_engine.py), keep it in the store beside the gateways' counts
(store/pd_counts.py, source ``engine:<instance>``), and judge ``pd_ineffective`` from both
(store/group_health.py). A decode that does not answer is skipped: its witness is missing, not
contrary."""

from __future__ import annotations

import asyncio
import time

import httpx2 as httpx  # httpx's maintained line (pyproject: httpx2)
from sqlalchemy.engine import Engine
from sqlmodel import Session, select
from temporalio import activity

from activities import callers
from activities.runner import Runner
from contracts.autoscale import DeploymentRef
from contracts.pd_health import GROUP_PD_HEALTH, PDHealth
from scheduler.groups.pd_engine import MAX_TEXT, engine_counts
from scheduler.groups.pd_health import PDCounts, engine_source
from scheduler.groups.status import PD_INEFFECTIVE
from store import group_health, pd_counts
from store.tables import InstanceRow

SCRAPE_TIMEOUT_S = 3.0  # a decode's /metrics, at most this long
MAX_DECODES = 64  # read at most this many decodes per check


def decodes(engine: Engine, deployment: str) -> list[tuple[str, str, str | None]]:
    """(instance, metrics URL, engine key) of each RUNNING decode of ``deployment`` with an address."""
    with Session(engine) as s:
        rows = s.exec(select(InstanceRow).where(InstanceRow.group_name == deployment, InstanceRow.role == "decode",
                                                InstanceRow.state == "running").order_by(InstanceRow.name))
        return [(r.name, f"http://{r.address}:{r.port}/metrics", r.engine_key) for r in rows
                if r.address and r.port][:MAX_DECODES]


async def scrape(http: httpx.AsyncClient, url: str, key: str | None) -> str | None:
    """The metrics text, None when it could not be read (or is larger than MAX_TEXT)."""
    try:
        async with http.stream("GET", url, headers={"Authorization": f"Bearer {key}"} if key else None) as r:
            if r.status_code != 200:
                return None
            body = b""
            async for chunk in r.aiter_bytes():
                body += chunk
                if len(body) > MAX_TEXT:
                    return None
            return body.decode("utf-8", "replace")
    except httpx.HTTPError:
        return None


def judged(engine: Engine, deployment: str, witness: dict[str, PDCounts], now: float) -> PDHealth:
    """Store the decodes' witnesses (source -> counts), then judge the deployment."""
    for source, got in witness.items():
        pd_counts.report(engine, source, {deployment: got}, now)
    with Session(engine) as s:
        why = group_health.pd_judged(s, [deployment], now).get(deployment)
    return PDHealth(degradations=[PD_INEFFECTIVE] if why else [], why=(why or "")[:500], scraped=len(witness))


class PDHealthActivities:
    def __init__(self, engine: Engine, runner: Runner):
        self.engine, self.runner = engine, runner

    def all(self) -> list:
        return [self.group_pd_health]

    @activity.defn(name=GROUP_PD_HEALTH)
    async def group_pd_health(self, ref: DeploymentRef) -> PDHealth:
        """The group's disaggregation now (its workflow calls this on its checks)."""
        callers.check(GROUP_PD_HEALTH, ref)
        found = await self.runner.run(decodes, self.engine, ref.deployment)
        async with httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S) as http:
            texts = await asyncio.gather(*(scrape(http, url, key) for _, url, key in found))
        witness = {}
        for (name, _, _), text in zip(found, texts):
            got = engine_counts(text) if text else None
            if got is not None:
                witness[engine_source(name, got[0])] = got[1]
        return await self.runner.run(judged, self.engine, ref.deployment, witness, time.time())
