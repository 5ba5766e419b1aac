"""What the serving path keeps in the store: the routing table's source (RUNNING instances with
the address and port of their server) and each gateway's in-flight counts, which the control
plane reads to drain a replica before it stops it.

Gateways are stateless apart from their in-flight counters. Each one reports them every
``REPORT_S`` (``report_load``); a gateway whose report is older than ``LIVE_S`` is gone and its
counts no longer hold a drain back."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import delete, func
from sqlalchemy.engine import Engine
from sqlmodel import Field, Session, SQLModel, select

from store.tables import InstanceRow, utcnow

REPORT_S = 0.5  # a gateway reports its in-flight counts this often
LIVE_S = 5.0  # a gateway silent this long no longer counts
IN_BATCH = 500  # instances named in one IN (...) list: well under SQLite's bound on parameters


class GatewayRow(SQLModel, table=True):
    __tablename__ = "gpuflow_gateways"
    id: str = Field(primary_key=True)  # unique per gateway process
    url: str = ""  # its base URL, as it was told to listen
    started_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class GatewayLoadRow(SQLModel, table=True):
    """Requests one gateway has in flight on one instance right now."""

    __tablename__ = "gpuflow_gateway_load"
    gateway: str = Field(primary_key=True)
    instance: str = Field(primary_key=True)
    in_flight: int = 0


@dataclass(frozen=True)
class Route:
    """One RUNNING replica a gateway may send requests to."""

    instance: str
    deployment: str  # the name requests use as their ``model``
    address: str
    port: int
    worker: str | None = None
    kv_events_port: int | None = None  # its engine's KV-cache events (ZMQ PUB on ``address``; gateway/kv_subscriber.py)
    engine_key: str | None = field(default=None, repr=False)  # what its engine answers (store/engine_keys.py)
    role: str | None = None  # a prefill/decode group's member: prefill, decode or router (None: a plain replica)
    group_gen: int = 0  # its group's generation (a prefill and a decode pair only within one)
    bootstrap_port: int | None = None  # its engine's KV hand-off port on ``address`` (SGLang's bootstrap)


FRONT_DOORS = (None, "router")  # a plain replica; a prefill/decode group's router (its members hand KV to each other)


def routes(engine: Engine) -> list[Route]:
    """Every RUNNING instance whose server has an address and a port, sorted by name. Of a
    prefill/decode group only its router takes requests: a prefill answers one token and a decode
    waits for KV, so sending them a request directly would serve it aggregated, the silent collapse
    a group exists to avoid (a group without a router is not served until the gateway pairs them)."""
    with Session(engine) as s:
        rows = s.exec(select(InstanceRow).where(InstanceRow.state == "running").order_by(InstanceRow.name))
        return [Route(instance=r.name, deployment=r.deployment, address=r.address or "127.0.0.1", port=r.port,
                      worker=r.worker, kv_events_port=r.kv_events_port, engine_key=r.engine_key, role=r.role,
                      group_gen=r.group_gen or 0, bootstrap_port=r.bootstrap_port) for r in rows
                if r.port and r.role in FRONT_DOORS]


MEMBER_ROLES = ("prefill", "decode")  # a group's members the gateway pairs itself (a group with no router)


@dataclass(frozen=True)
class Members:
    """A prefill/decode group's members, as the gateway pairs them: the RUNNING ones with a port,
    and for each generation the names its deployment wants (readiness ``all`` waits for all of them)."""

    routes: tuple[Route, ...] = ()
    wanted: tuple[tuple[int, frozenset[str]], ...] = ()  # (generation, wanted member names), by generation

    def wanted_of(self, gen: int) -> frozenset[str]:
        return next((names for g, names in self.wanted if g == gen), frozenset())


def group_members(engine: Engine) -> dict[str, Members]:
    """Each deployment's prefill and decode members (RUNNING with a port, or wanted), in one query;
    ``routes()`` leaves them out (a request straight to either would be served aggregated)."""
    with Session(engine) as s:
        rows = s.exec(select(InstanceRow).where(InstanceRow.role.in_(MEMBER_ROLES))
                      .where((InstanceRow.state == "running") | (InstanceRow.wanted == True))  # noqa: E712
                      .order_by(InstanceRow.name)).all()
    running: dict[str, list[Route]] = {}
    wanted: dict[str, dict[int, set[str]]] = {}
    for r in rows:
        dep = r.group_name or r.deployment
        if r.state == "running" and r.port:
            running.setdefault(dep, []).append(Route(
                instance=r.name, deployment=dep, address=r.address or "127.0.0.1", port=r.port, worker=r.worker,
                kv_events_port=r.kv_events_port, engine_key=r.engine_key, role=r.role, group_gen=r.group_gen or 0,
                bootstrap_port=r.bootstrap_port))
        if r.wanted:
            wanted.setdefault(dep, {}).setdefault(r.group_gen or 0, set()).add(r.name)
    return {d: Members(tuple(running.get(d, ())),
                       tuple((g, frozenset(ns)) for g, ns in sorted(wanted.get(d, {}).items())))
            for d in running.keys() | wanted.keys()}


def report_load(engine: Engine, gateway: str, url: str, in_flight: dict[str, int],
                now: datetime | None = None) -> None:
    """Replace ``gateway``'s counts with ``in_flight`` (instance -> requests; zeros may be left
    out) and mark it alive, in one transaction."""
    now = now or utcnow()
    with Session(engine) as s:
        row = s.get(GatewayRow, gateway) or GatewayRow(id=gateway, url=url, started_at=now)
        row.url, row.updated_at = url, now
        s.add(row)
        s.exec(delete(GatewayLoadRow).where(GatewayLoadRow.gateway == gateway))
        s.add_all(GatewayLoadRow(gateway=gateway, instance=i, in_flight=n) for i, n in in_flight.items() if n > 0)
        s.commit()


def forget_gateway(engine: Engine, gateway: str) -> None:
    """A gateway shutting down cleanly takes its rows with it."""
    with Session(engine) as s:
        s.exec(delete(GatewayLoadRow).where(GatewayLoadRow.gateway == gateway))
        s.exec(delete(GatewayRow).where(GatewayRow.id == gateway))
        s.commit()


def in_flight(engine: Engine, instance: str, now: datetime | None = None, live_s: float = LIVE_S) -> int:
    """Requests the live gateways have in flight on ``instance`` (0 when none is live)."""
    with Session(engine) as s:
        return in_flight_of(s, [instance], (now or utcnow()) - timedelta(seconds=live_s)).get(instance, 0)


def in_flight_of(s: Session, instances: list[str], since: datetime) -> dict[str, int]:
    """Requests the gateways alive since ``since`` have in flight on each of ``instances``, a query
    per IN_BATCH of them (an instance with none is left out)."""
    out: dict[str, int] = {}
    for k in range(0, len(instances), IN_BATCH):
        rows = s.exec(select(GatewayLoadRow.instance, func.sum(GatewayLoadRow.in_flight))
                      .join(GatewayRow, GatewayRow.id == GatewayLoadRow.gateway)
                      .where(GatewayLoadRow.instance.in_(instances[k:k + IN_BATCH]), GatewayRow.updated_at >= since)
                      .group_by(GatewayLoadRow.instance))
        out.update((i, int(n)) for i, n in rows if n)
    return out


def metrics_url(gateway_url: str) -> str:
    """A gateway registers its OpenAI base ``http://HOST:PORT/v1``; its metrics are at /metrics."""
    base = gateway_url.rstrip("/")
    return (base[:-3] if base.endswith("/v1") else base) + "/metrics"


def live_gateways(engine: Engine, now: datetime | None = None, live_s: float = LIVE_S) -> list[GatewayRow]:
    since = (now or utcnow()) - timedelta(seconds=live_s)
    with Session(engine) as s:
        return list(s.exec(select(GatewayRow).where(GatewayRow.updated_at >= since)
                           .order_by(GatewayRow.id)))

