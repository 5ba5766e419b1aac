"""The overview's data, read from the store in a few whole-table queries (as ``gpuflow status
--data-dir`` reads it, offline): each host with its GPUs (VRAM total, claimed by gpuflow's
ledger, used as the host's agent measures it, used by processes gpuflow did not start), its NUMA
and NVLink groups (views/render/cluster.py's ``topology``, the CLI's own words), the counts of
deployments and replicas by state, and the live gateways with their requests in flight.

``hosts_page`` filters and pages the hosts, so 100 hosts stay readable; the summary above the
table (hosts by state, GPUs by model) covers them all."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

from sqlalchemy import func
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from contracts.host import host_kind
from scheduler import foreign
from scheduler.naming import natural_key
from views.render.cluster import topology
from store.ledger import booked_per_gpu
from store.serving import LIVE_S, GatewayLoadRow, GatewayRow
from store.tables import DeploymentRow, InstanceRow, WorkerRow, utcnow
from store.usage import InstanceUsageRow

PAGE = 25  # hosts per page


@dataclass
class Gpu:
    index: int
    name: str
    vram_total: int
    claimed: int  # booked by gpuflow's ledger
    used: int | None  # measured by the host's agent (NVML, or the simulator's ratio); None: not measured
    foreign: int | None  # held by processes gpuflow did not start

    @property
    def foreign_text(self) -> str:
        """'3.2 GiB used by other processes' ('' when none)."""
        return foreign.words(self.foreign) if self.foreign else ""


@dataclass
class Host:
    name: str
    state: str
    kind: str  # contracts/host_kinds.py HOST_KINDS
    cordoned: bool
    cordon_reason: str
    reason: str
    gpus: list[Gpu]
    topology: str
    ram_total: int
    updated_at: datetime | None
    degraded: list[str] = field(default_factory=list)  # cards where other processes' memory grew past the room left


@dataclass
class Overview:
    hosts: list[Host]  # this page's
    matched: int  # hosts the filter kept
    total: int
    page: int
    pages: int
    host_states: dict[str, int]
    gpu_models: dict[str, int]
    gpus: int
    vram_total: int
    vram_claimed: int
    deployments: dict[str, int]
    replicas: dict[str, int]
    gateways: list[dict[str, Any]] = field(default_factory=list)


def _measured(s: Session) -> dict[tuple[str, int], int]:
    """(host, GPU index) -> bytes the replicas there use, summed from their latest samples."""
    out: dict[tuple[str, int], int] = defaultdict(int)
    for host, gpus in s.exec(select(InstanceUsageRow.host, InstanceUsageRow.gpus)):
        for g in gpus or []:
            if isinstance(g, dict) and isinstance(g.get("index"), int):
                out[host, g["index"]] += int(g.get("used") or 0)
    return out


def _host(w: WorkerRow, booked: dict[tuple[str, int], int], measured: dict[tuple[str, int], int]) -> Host:
    gpus = []
    for g in w.gpus or []:
        i = g.get("index", 0)
        used = measured.get((w.name, i))
        gpus.append(Gpu(index=i, name=str(g.get("name") or "GPU"), vram_total=int(g.get("vram_total") or 0),
                        claimed=booked.get((w.name, i), 0), used=used if used is not None else g.get("vram_used"),
                        foreign=g.get("vram_foreign")))
    judged = foreign.degradations([SimpleNamespace(index=g.index, vram_total=g.vram_total, vram_foreign=g.foreign)
                                   for g in gpus], w.reserved_vram, {g.index: g.claimed for g in gpus})
    return Host(name=w.name, state=w.state, kind=host_kind(w.simulated, w.runs), cordoned=bool(w.cordoned),
                cordon_reason=w.cordon_reason or "",
                reason=w.state_reason, gpus=sorted(gpus, key=lambda g: g.index), topology=topology(w.gpus or []),
                ram_total=w.ram_total, updated_at=w.updated_at, degraded=[d.text() for d in judged])


def gateways(s: Session, now: datetime) -> list[dict[str, Any]]:
    since = now - timedelta(seconds=LIVE_S)
    flying = dict(s.exec(select(GatewayLoadRow.gateway, func.sum(GatewayLoadRow.in_flight))
                         .group_by(GatewayLoadRow.gateway)).all())
    return [{"id": g.id, "url": g.url, "in_flight": int(flying.get(g.id) or 0),
             "up_s": (now - g.started_at).total_seconds()}
            for g in s.exec(select(GatewayRow).where(GatewayRow.updated_at >= since).order_by(GatewayRow.id))]


GONE = "deleted"  # a deployment's or a replica's state once it is gone


def overview(engine: Engine, q: str = "", state: str = "", page: int = 1, now: datetime | None = None) -> Overview:
    """The overview of the cluster; hosts whose name contains ``q`` and whose state is ``state``
    (either may be empty), ``page`` (from 1) of them."""
    now = now or utcnow()
    booked = booked_per_gpu(engine)
    with Session(engine) as s:
        workers = sorted(s.exec(select(WorkerRow)).all(), key=lambda w: natural_key(w.name))
        measured = _measured(s)
        # the headline counts are of what exists: deleted deployments and replicas keep their rows (history), not a count
        deployments = Counter(dict(s.exec(select(DeploymentRow.state, func.count()).where(DeploymentRow.state != GONE)
                                          .group_by(DeploymentRow.state)).all()))
        replicas = Counter(dict(s.exec(select(InstanceRow.state, func.count()).where(InstanceRow.state != GONE)
                                       .group_by(InstanceRow.state)).all()))
        gws = gateways(s, now)
    hosts = [_host(w, booked, measured) for w in workers]
    kept = [h for h in hosts if q.lower() in h.name.lower() and (not state or _state(h) == state)]
    pages = max(1, -(-len(kept) // PAGE))
    page = min(max(1, page), pages)
    all_gpus = [g for h in hosts for g in h.gpus]
    return Overview(hosts=kept[(page - 1) * PAGE:page * PAGE], matched=len(kept), total=len(hosts), page=page,
                    pages=pages, host_states=dict(Counter(_state(h) for h in hosts)),
                    gpu_models=dict(Counter(g.name for g in all_gpus)), gpus=len(all_gpus),
                    vram_total=sum(g.vram_total for g in all_gpus), vram_claimed=sum(g.claimed for g in all_gpus),
                    deployments=dict(deployments), replicas=dict(replicas), gateways=gws)


def _state(h: Host) -> str:
    """The state the overview groups by: a cordoned READY host is 'cordoned'."""
    return "cordoned" if h.cordoned and h.state == "ready" else h.state
