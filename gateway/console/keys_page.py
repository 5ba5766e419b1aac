"""The API-keys page: the keys (id, tenant, name, admin, created, revoked) with each key's and
each tenant's requests and tokens over the last hour and day, read from the store as ``gpuflow
keys list`` and ``keys usage`` read it offline (activities/cluster_reads.py ``key_view`` and
``key_usage_rows``). An admin key (or the open console) sees every key and may create and revoke
them; any other key sees its own tenant's.

Create and revoke go through Temporal as the CLI's do (gpuflow/cluster_client.py), so the
cluster workflow validates and records them; a new key is made here, and only its salted hash
travels. The key itself is in the create action's JSON answer (``Cache-Control: no-store``) and
nowhere else: the page's script shows it once, it is never put in a cookie, a URL or a log."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone

from starlette.responses import JSONResponse

from activities.cluster_reads import key_usage_rows, key_view
from contracts.cluster import KEY_ID, KeyView, UsageRow
from gateway.console import temporal
from gateway.console.web import Page, action_body, page, page_number
from scheduler.errors import InvalidInput
from store import keys

PAGE = 100  # keys per page


@dataclass
class KeysView:
    keys: list[KeyView]  # this page's
    total: int  # keys this caller may see
    page: int
    pages: int
    tenants: list[UsageRow] = field(default_factory=list)  # each tenant's total (key_id None)
    usage: dict[str, UsageRow] = field(default_factory=dict)  # key id ("" an open gateway's requests) -> its use


def gather(engine, tenant: str | None, page_no: int, now: datetime) -> KeysView:
    """The keys of ``tenant`` (None: every key), page ``page_no`` of them, and the use of those
    tenants and keys over the last hour and day."""
    mine = [k for k in keys.list_keys(engine) if tenant is None or k.tenant == tenant]
    pages = max(1, -(-len(mine) // PAGE))
    page_no = min(max(1, page_no), pages)
    rows = [r for r in key_usage_rows(engine, now) if tenant is None or r.tenant == tenant]
    return KeysView(keys=[key_view(k) for k in mine[(page_no - 1) * PAGE:page_no * PAGE]], total=len(mine),
                    page=page_no, pages=pages, tenants=[r for r in rows if r.key_id is None],
                    usage={r.key_id: r for r in rows if r.key_id is not None})


async def show(gw, request, caller) -> Page:
    view = await asyncio.to_thread(gather, gw.engine, None if caller.admin else caller.tenant, page_number(request),
                                   datetime.now(timezone.utc))
    return Page("keys.html", {"title": "API keys", "v": view})



def _text(data: dict, name: str) -> str:
    v = data.get(name, "")
    if not isinstance(v, str):
        raise InvalidInput(f"{name} must be text")
    return v.strip()


async def create(gw, request, caller) -> JSONResponse:
    from gpuflow import cluster_client

    data = await action_body(request)
    tenant, name = _text(data, "tenant"), _text(data, "name")
    admin = data.get("admin") in ("on", True)  # a checked box, as the form sends it
    keys.new_key(tenant, name)  # the tenant and the name refused here, naming the problem, before Temporal
    key, view = await cluster_client.create_key(await temporal.client(gw), tenant, name, admin)
    kind = "admin API key" if view.admin else "API key"
    return JSONResponse({"message": f"{kind} {view.id} created for tenant {view.tenant}", "id": view.id,
                         "tenant": view.tenant, "admin": view.admin, "key": key},
                        headers={"cache-control": "no-store"})


async def revoke(gw, request, caller) -> JSONResponse:
    from gpuflow import cluster_client

    kid = _text(await action_body(request), "id")
    if not re.match(KEY_ID, kid):
        raise InvalidInput("give a key's id: 12 hex digits, as the list shows it")
    view = await cluster_client.revoke_key(await temporal.client(gw), kid)
    return JSONResponse({"message": f"API key {view.id} (tenant {view.tenant}) revoked", "id": view.id})


ROUTES = [("/keys", page(show), ["GET"]),
          ("/keys/create", page(create, admin=True, action=True), ["POST"]),
          ("/keys/revoke", page(revoke, admin=True, action=True), ["POST"])]
