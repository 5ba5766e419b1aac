"""The overview page: hosts and their GPUs, deployments and replicas by state, the gateways
(cluster_view.py gathers it). Query parameters ``q`` (a host name contains it), ``state`` and
``page`` filter and page the hosts."""

from __future__ import annotations

import asyncio
import re

from contracts.host import HOST_KINDS
from console.cluster_view import overview
from console.web import Page, page, page_number

STATE = re.compile(r"^[a-z_]{0,32}$")


async def show(con, request, caller) -> Page:
    qp = request.query_params
    q = qp.get("q", "")[:100]
    state = qp.get("state", "")
    state = state if STATE.match(state) else ""
    ov = await asyncio.to_thread(overview, con.engine, q, state, page_number(request))
    return Page("overview.html", {"title": "Overview", "ov": ov, "q": q, "state": state, "kinds": HOST_KINDS})


ROUTES = [("/", page(show), ["GET"])]
