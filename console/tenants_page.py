"""The tenants page: each tenant's use of GPUs and VRAM against its guarantee and limit, as bars
(what ``gpuflow tenants`` shows, read from the store as ``gpuflow tenants --data-dir`` reads it:
views/tenancy.py). A key that is not an admin's sees its own tenant and ``default``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from console.web import Page, page
from gateway.table import DEFAULT_TENANT
from views import tenancy as tenancy_view

RESOURCES = ("gpus", "vram")


@dataclass(frozen=True)
class Bar:
    used: float  # % of the bar's width
    guarantee: float | None  # where its mark sits, %
    over: bool  # use beyond the guarantee: borrowing


def bar(used: int, guarantee: int | None, limit: int | None) -> Bar:
    """The bar's full width is the limit; without one, the larger of the use and the guarantee
    (an unbounded tenant's bar is full at what it holds). Widths in %, rounded to 0.1."""
    scale = limit or max(used, guarantee or 0)
    pct = (lambda v: round(min(100.0, 100 * v / scale), 1)) if scale else (lambda v: 0.0)
    return Bar(used=pct(used), guarantee=pct(guarantee) if guarantee is not None else None,
               over=guarantee is not None and used > guarantee)


def shown(rows: list[dict[str, Any]], caller) -> list[dict[str, Any]]:
    """The rows the caller may see, each with its bars."""
    mine = (lambda t: True) if caller.cluster_admin else (lambda t: t in (caller.tenant, DEFAULT_TENANT))
    return [{**r, "bars": {k: bar(r[k]["used"] or 0, r[k]["guarantee"], r[k]["limit"]) for k in RESOURCES}}
            for r in rows if mine(r["tenant"])]


async def show(con, request, caller) -> Page:
    queueing, rows = await asyncio.to_thread(tenancy_view.tenants, con.engine)
    return Page("tenants.html", {"title": "Tenants", "queueing": queueing, "rows": shown(rows, caller)})


ROUTES = [("/tenants", page(show), ["GET"])]
