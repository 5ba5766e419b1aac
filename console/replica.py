"""A replica's page: its state, host, GPUs and reason and its ledger lines, read from the store; its
placement decision as ``gpuflow explain`` shows it (the control plane's ``explain``, one query of its
workflow: the filters' verdicts per host, the candidates with each scorer's points, the chosen
one, the victims it preempted); the preemptions that took its GPUs; and a link to its workflow
in the Temporal UI. A PENDING replica shows its current reason, as ``status`` and ``queue`` do
(the queue's wake keeps it current in the store)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from contracts.ids import instance_id
from console.web import Page, page
from views.render.explain import explain, request_text
from scheduler.errors import GpuflowError, InvalidInput
from scheduler.naming import name_problem
from store.tables import DeploymentRow, InstanceRow, ReservationRow

EXPLAIN_S = 10.0  # the decision's query; past it the page shows the store's part and says why
PREEMPTIONS_SEEN = 200  # the newest preemptions searched for this replica


@dataclass
class Stored:
    name: str
    deployment: str
    spec: dict[str, Any]
    state: str
    reason: str
    worker: str | None
    gpu_indexes: list[int]
    subordinates: list[dict[str, Any]]
    ledger: list[ReservationRow] = field(default_factory=list)


def stored(engine: Engine, name: str) -> Stored | None:
    """The replica's row, its deployment's spec and its ledger lines (three primary-key or indexed reads)."""
    with Session(engine) as s:
        row = s.get(InstanceRow, name)
        if row is None:
            return None
        dep = s.get(DeploymentRow, row.deployment)
        ledger = list(s.exec(select(ReservationRow).where(ReservationRow.instance == name)
                             .order_by(ReservationRow.role, ReservationRow.worker, ReservationRow.gpu_index)))
    subs = (row.placement or {}).get("subordinates") or []
    return Stored(name=row.name, deployment=row.deployment, spec=dep.spec if dep is not None else {}, state=row.state,
                  reason=row.reason, worker=row.worker, gpu_indexes=list(row.gpu_indexes or []),
                  subordinates=[x for x in subs if isinstance(x, dict)], ledger=ledger)


def ui_link(ui: str, namespace: str, name: str) -> str | None:
    """The replica's workflow in the Temporal UI: ``{ui}/namespaces/{ns}/workflows/{id}``, each part
    quoted whole (the id holds a '/'); the UI opens its latest run. None without a UI."""
    if not ui:
        return None
    return f"{ui.rstrip('/')}/namespaces/{quote(namespace, safe='')}/workflows/{quote(instance_id(name), safe='')}"


def candidates(dec: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """The scorers' names (columns, in the chain's order) and the candidates, each marked ``chosen``
    where it is the placement (worker and GPUs), as ``gpuflow explain`` marks it with '*'."""
    cands = dec.get("candidates") or []
    placed = dec.get("placement") or {}
    names = list((cands[0].get("scores") or {}) if cands else [])
    key = (placed.get("worker"), placed.get("gpu_indexes")) if dec.get("scheduled") else None
    return names, [{**c, "chosen": key is not None and (c.get("worker"), c.get("gpu_indexes")) == key}
                   for c in cands]


async def _explain(con, name: str) -> tuple[dict[str, Any] | None, str]:
    """``gpuflow explain NAME``'s dict, or why it could not be read."""
    try:
        return await asyncio.wait_for(con.control().explain(name), EXPLAIN_S), ""
    except GpuflowError as e:  # refused (InvalidInput) or not answered (gpuflow.runtime.Unreachable)
        return None, str(e)
    except asyncio.TimeoutError:
        return None, f"its workflow did not answer within {EXPLAIN_S:g} s (is a control-plane worker running?)"


def _preemptions(engine: Engine, name: str) -> list:
    from views.tenancy import preemptions

    return [p for p in preemptions(engine, PREEMPTIONS_SEEN)
            if p.instance == name or any(v["name"] == name for v in p.victims)]


async def show(con, request, caller) -> Page:
    name = request.path_params["instance"]
    problem = name_problem(name)
    if problem:
        raise InvalidInput(f"replica name {name[:80]!r}: {problem}")
    st = await asyncio.to_thread(stored, con.engine, name)
    if st is None or not caller.sees(st.spec):
        return Page("error.html", {"title": "404", "message": f"no replica named {name!r} that you may see"}, 404)
    (d, why_not), preempted = await asyncio.gather(_explain(con, name),
                                                   asyncio.to_thread(_preemptions, con.engine, name))
    now = st.reason if st.state == "pending" and st.reason else None  # serving_view.pending_reason's rule, same row
    text = None
    if d is not None:
        if now:
            d["now"] = now  # what status and queue show (gpuflow explain adds it the same way)
        text = explain(d)
    dec = (d or {}).get("decision") or {}
    names, cands = candidates(dec)
    return Page("replica.html", {
        "title": name, "st": st, "d": d, "why_not": why_not, "now": now, "dec": dec, "scorers": names,
        "candidates": cands, "text": text, "preemptions": preempted, "searched": PREEMPTIONS_SEEN,
        "request": request_text((d or {}).get("request")),  # explain's own words for it
        "ui": ui_link(con.settings.temporal_ui_url, con.namespace, name)})


ROUTES = [("/replicas/{instance}", page(show), ["GET"])]
