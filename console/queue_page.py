"""The queue page: the PENDING queue in the order the next wake sees it, each replica with its
tenant, priorities, wait and reason (the wake's own verdicts, read from the store as ``gpuflow
queue --data-dir`` reads them: views/tenancy.py), and the newest preemptions. A key that
is not an admin's sees the replicas of the deployments it may see (access.Caller.sees), and a
preemption when it sees the preemptor's deployment; a victim it may not see is named by tenant."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from console.web import Page, page, page_number
from views import tenancy as tenancy_view
from store.tables import DeploymentRow

PAGE = 100  # queue lines per page


def specs(engine: Engine) -> dict[str, dict[str, Any]]:
    """Every deployment's spec by name, in one query (who may see what)."""
    with Session(engine) as s:
        return dict(s.exec(select(DeploymentRow.name, DeploymentRow.spec)).all())


def visible_preemption(p: tenancy_view.Preemption, sees) -> dict[str, Any] | None:
    """``p`` as the caller may see it: None when it may not see the preemptor's deployment; each
    victim it may not see named only by tenant."""
    if not sees(p.deployment):
        return None
    victims = [v["name"] if sees(v["deployment"]) else f"a replica of tenant {v['tenant']}" for v in p.victims]
    return {"at": p.at, "instance": p.instance, "tenant": p.tenant, "victims": victims, "why": p.why}


def gather(engine: Engine, caller) -> dict[str, Any]:
    queueing, rows = tenancy_view.queue(engine)  # the store's reasons: nothing is judged here
    by_name = specs(engine)

    def sees(deployment: str) -> bool:
        return caller.sees(by_name.get(deployment) or {})

    shown = [r for r in rows if sees(r["deployment"])]
    preempted = [v for v in (visible_preemption(p, sees) for p in tenancy_view.preemptions(engine)) if v]
    return {"queueing": queueing, "rows": shown, "hidden": len(rows) - len(shown), "preemptions": preempted}


async def show(con, request, caller) -> Page:
    data = await asyncio.to_thread(gather, con.engine, caller)
    pages = max(1, -(-len(data["rows"]) // PAGE))
    at = min(max(1, page_number(request)), pages)
    return Page("queue.html", {"title": "Queue", **data, "total": len(data["rows"]), "page": at, "pages": pages,
                               "rows": data["rows"][(at - 1) * PAGE:at * PAGE]})


ROUTES = [("/queue", page(show), ["GET"])]
