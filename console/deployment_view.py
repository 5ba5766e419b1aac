"""The Deployments pages' data. What every replica is doing comes from the store in whole-table
queries (as the overview's does), so 1,000 replicas cost a few queries, not 1,000 workflow
queries: the deployment rows, the replicas' rows, the live gateways' in-flight counts
(store/serving.py) and the hosts' latest memory figures (store/usage.py, summed per replica by
views/usage.py ``summed`` and put in words by views/render/usage.py, as ``gpuflow
status`` does). What only a workflow keeps (a rollout's steps and versions, the autoscaler's
recent steps) is asked of that one workflow through Temporal, as ``gpuflow rollout status`` and
``gpuflow autoscale`` ask it (console/deployments.py)."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import yaml
from sqlalchemy import func
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from console.access import Caller
from gateway.table import owner, routing_of
from scheduler.naming import natural_key
from views.render.spec_text import readable
from views.render.usage import column, warning
from views.usage import summed
from store import decision_log, group_health
from store.decision_log import DecisionRow
from store.serving import LIVE_S, in_flight_of
from store.tables import DeploymentRow, InstanceRow, utcnow
from store.usage import InstanceUsageRow

PAGE = 50  # deployments per page
HIDDEN = "***"  # an env value is never shown: it may hold a secret
STEPS_KEPT = 20  # the store's kept autoscaler steps shown


@dataclass
class Summary:
    """One line of the Deployments list."""

    name: str
    tenant: str
    backend: str
    state: str  # active | deleting
    desired: int
    running: int
    by_state: dict[str, int]
    routing: str  # the spec's, or "gateway default"
    autoscaled: bool


@dataclass
class Listing:
    rows: list[Summary]  # this page's
    matched: int
    total: int  # deployments this caller may see
    page: int
    pages: int


@dataclass
class Replica:
    name: str
    state: str
    worker: str | None
    gpus: list[int]
    address: str  # address:port, or '-'
    in_flight: int
    reason: str
    vram: str  # 'used/claimed GiB' (render/usage.column)
    vram_warning: str
    restarts: int
    role: str | None = None  # a prefill/decode group's member: its role


@dataclass
class RoleLine:
    """One role of a group: its members running against its replicas (the form scales it)."""

    role: str
    running: int
    wanted: int


@dataclass
class Detail:
    name: str
    summary: Summary
    spec_yaml: str
    replicas: list[Replica]
    roles: list[RoleLine] = field(default_factory=list)  # a prefill/decode group's; [] otherwise
    degradations: list[str] = field(default_factory=list)  # the group's (store/group_health.py)
    degraded_why: dict[str, str] = field(default_factory=dict)  # a degradation -> what shows it (pd_ineffective's counts)
    kept_steps: list[dict[str, Any]] = field(default_factory=list)  # the store's autoscaler steps, newest last


def masked(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec with every ``env`` value replaced by ``***`` (the names stay: they say what is set)."""
    env = spec.get("env")
    if not isinstance(env, dict):
        return dict(spec)
    return {**spec, "env": {str(k): HIDDEN for k in env}}


def spec_yaml(spec: dict[str, Any]) -> str:
    """The spec as YAML, its env values masked and its sizes in GiB (views/render/spec_text.py)."""
    return yaml.safe_dump(readable(masked(spec)), sort_keys=False, default_flow_style=False, allow_unicode=True)


def _summary(d: DeploymentRow, states: dict[str, int]) -> Summary:
    spec = d.spec or {}
    tenant, _ = owner(spec)
    return Summary(name=d.name, tenant=tenant, backend=str(spec.get("backend") or "-"), state=d.state,
                   desired=d.replicas, running=states.get("running", 0), by_state=dict(sorted(states.items())),
                   routing=routing_of(spec) or "gateway default", autoscaled=isinstance(spec.get("autoscaling"), dict))


def _states(s: Session, names: list[str] | None = None) -> dict[str, dict[str, int]]:
    """deployment -> {state: replicas}, deleted replicas left out (``names``: only these)."""
    q = (select(InstanceRow.deployment, InstanceRow.state, func.count()).where(InstanceRow.state != "deleted")
         .group_by(InstanceRow.deployment, InstanceRow.state))
    if names is not None:
        q = q.where(InstanceRow.deployment.in_(names))
    out: dict[str, dict[str, int]] = defaultdict(dict)
    for dep, state, n in s.exec(q):
        out[dep][state] = n
    return out


def listing(engine: Engine, caller: Caller, q: str = "", page: int = 1) -> Listing:
    """The deployments ``caller`` may see whose name contains ``q``, ``page`` (from 1) of them."""
    with Session(engine) as s:
        rows = [d for d in s.exec(select(DeploymentRow).where(DeploymentRow.state != "deleted"))
                if caller.sees(d.spec or {})]
        kept = sorted((d for d in rows if q.lower() in d.name.lower()), key=lambda d: natural_key(d.name))
        pages = max(1, -(-len(kept) // PAGE))
        page = min(max(1, page), pages)
        shown = kept[(page - 1) * PAGE:page * PAGE]
        states = _states(s, [d.name for d in shown])
    return Listing(rows=[_summary(d, states.get(d.name, {})) for d in shown], matched=len(kept), total=len(rows),
                   page=page, pages=pages)


def _memory(s: Session, names: list[str]) -> dict[str, dict[str, Any]]:
    """instance -> views/usage.py's figures, from the hosts' latest reports kept in the store."""
    parts: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in s.exec(select(InstanceUsageRow).where(InstanceUsageRow.instance.in_(names))):
        parts[r.instance].append({"host": r.host, "gpus": r.gpus or [], "rss": r.rss, "rss_peak": r.rss_peak,
                                  "measured": r.measured})
    return {i: summed(p) for i, p in parts.items()}


def _replica(r: InstanceRow, flying: dict[str, int], mem: dict[str, dict[str, Any]]) -> Replica:
    v = mem.get(r.name) if r.state not in ("pending", "deleted") else None
    return Replica(name=r.name, state=r.state, worker=r.worker, gpus=list(r.gpu_indexes or []),
                   address=f"{r.address or '-'}:{r.port}" if r.port else "-", in_flight=flying.get(r.name, 0),
                   reason=r.reason, vram=column(v), vram_warning=warning(v), restarts=r.restarts, role=r.role)


def detail(engine: Engine, caller: Caller, name: str) -> Detail | None:
    """Deployment ``name`` with its replicas; None when there is none this caller may see."""
    with Session(engine) as s:
        d = s.get(DeploymentRow, name)
        if d is None or d.state == "deleted" or not caller.sees(d.spec or {}):
            return None
        rows = sorted(s.exec(select(InstanceRow).where(InstanceRow.deployment == name,
                                                      InstanceRow.state != "deleted")),
                      key=lambda r: natural_key(r.name))
        names = [r.name for r in rows]
        flying, mem = in_flight_of(s, names, utcnow() - timedelta(seconds=LIVE_S)), _memory(s, names)
        kept = list(s.exec(select(DecisionRow).where(DecisionRow.deployment == name, DecisionRow.kind == "autoscale")
                           .order_by(DecisionRow.id.desc()).limit(STEPS_KEPT)))
        group = group_health.standing(s, d)
    steps = [{**_step(r), "at": r.at, "inputs": r.digest} for r in reversed(kept)]
    states = dict(Counter(r.state for r in rows))
    roles = [RoleLine(r.value, ran, want) for r, (ran, want) in group.counts.items()] if group else []
    return Detail(name=name, summary=_summary(d, states), spec_yaml=spec_yaml(d.spec or {}),
                  replicas=[_replica(r, flying, mem) for r in rows], kept_steps=steps, roles=roles,
                  degradations=group.degradations if group else [], degraded_why=group.why if group else {})


def _step(row: DecisionRow) -> dict:
    """A kept autoscaler step; a damaged or altered one is shown as such, not as a 500."""
    try:
        return decision_log.record_of(row)
    except decision_log.Damaged as e:
        return {"direction": "?", "desired": "?", "rule": "damaged", "reason": str(e)}
