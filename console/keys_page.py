"""The API-keys page: the keys (id, tenant, name, scope, created, revoked) with each key's and
each tenant's requests and tokens over the last hour and day, read from the store as ``gpuflow
keys list`` and ``keys usage`` read it offline (views/keys.py ``key_view`` and
``key_usage_rows``). What a caller sees is its scope's: a cluster-admin (or the open console)
every key and tenant; a tenant-admin its tenant's keys and figures; a tenant key itself. Who may
create and revoke which key is rules.py's ``key``.

Create and revoke go through the control plane as the CLI's do (console/plane.py), so the
cluster workflow validates and records them; a new key is made here, and only its salted hash
travels. The key itself is in the create action's JSON answer (``Cache-Control: no-store``) and
nowhere else: the page's script shows it once, it is never put in a cookie, a URL or a log."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone

from starlette.responses import JSONResponse

from views.keys import key_usage_rows, key_view
from contracts.cluster import KEY_ID, KeyView, UsageRow
from contracts.scopes import SCOPES, TENANT
from console import access, rules
from console.web import Page, action_body, page, page_number
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


def gather(engine, tenant: str | None, page_no: int, now: datetime, key_id: str | None = None) -> KeysView:
    """The keys of ``tenant`` (None: every key; ``key_id``: that one only), page ``page_no`` of
    them, and the use of those keys (and, without ``key_id``, of those tenants) over the last hour
    and day."""
    def kept(t: str, kid: str | None) -> bool:
        return (tenant is None or t == tenant) and (key_id is None or kid == key_id)
    mine = [k for k in keys.list_keys(engine) if kept(k.tenant, k.id)]
    pages = max(1, -(-len(mine) // PAGE))
    page_no = min(max(1, page_no), pages)
    rows = [r for r in key_usage_rows(engine, now) if kept(r.tenant, r.key_id if key_id else None)]
    return KeysView(keys=[key_view(k) for k in mine[(page_no - 1) * PAGE:page_no * PAGE]], total=len(mine),
                    page=page_no, pages=pages, tenants=[r for r in rows if r.key_id is None],
                    usage={r.key_id: r for r in rows if r.key_id is not None})


def shown_to(caller) -> tuple[str | None, str | None]:
    """(tenant, key id) a caller's keys page is cut to: a cluster-admin sees all, a tenant-admin its
    tenant, a tenant key itself."""
    if caller.cluster_admin:
        return None, None
    return caller.tenant, None if caller.admin else caller.key_id


async def show(con, request, caller) -> Page:
    tenant, key_id = shown_to(caller)
    view = await asyncio.to_thread(gather, con.engine, tenant, page_number(request), datetime.now(timezone.utc), key_id)
    revocable = {k.id for k in view.keys if rules.key(caller.scope, caller.tenant, "revoke", k.tenant, k.scope) is None}
    return Page("keys.html", {"title": "API keys", "v": view, "scopes": grantable(caller), "revocable": revocable})


def grantable(caller) -> list[str]:
    """The scopes the create form offers this caller (rules.key decides)."""
    return [s for s in SCOPES if rules.key(caller.scope, caller.tenant, "create", caller.tenant, s) is None]



def _text(data: dict, name: str) -> str:
    v = data.get(name, "")
    if not isinstance(v, str):
        raise InvalidInput(f"{name} must be text")
    return v.strip()


CREATE_FIELDS = {"tenant", "name", "scope"}


async def create(con, request, caller) -> JSONResponse:
    data = await action_body(request)
    extra = sorted(set(data) - CREATE_FIELDS)
    if extra:
        raise InvalidInput(f"a new key takes {', '.join(sorted(CREATE_FIELDS))}; it was given {str(extra[0])[:40]!r}")
    tenant, name, scope = _text(data, "tenant"), _text(data, "name"), _text(data, "scope") or TENANT
    keys.new_key(tenant, name, scope)  # tenant, name and scope refused here, naming the problem, before Temporal
    why = rules.key(caller.scope, caller.tenant, "create", tenant, scope)
    if why:
        raise access.Forbidden(why)
    key, view = await con.control().create_key(tenant, name, scope)
    return JSONResponse({"message": f"{view.scope} API key {view.id} created for tenant {view.tenant}", "id": view.id,
                         "tenant": view.tenant, "scope": view.scope, "admin": view.admin, "key": key},
                        headers={"cache-control": "no-store"})


async def revoke(con, request, caller) -> JSONResponse:
    kid = _text(await action_body(request), "id")
    if not re.match(KEY_ID, kid):
        raise InvalidInput("give a key's id: 12 hex digits, as the list shows it")
    k = await asyncio.to_thread(keys.get, con.engine, kid)
    if k is None or not (caller.cluster_admin or k.tenant == caller.tenant):
        raise InvalidInput(f"no API key with id {kid!r} that you may see")
    why = rules.key(caller.scope, caller.tenant, "revoke", k.tenant, k.scope)
    if why:
        raise access.Forbidden(why)
    view = await con.control().revoke_key(kid)
    return JSONResponse({"message": f"API key {view.id} (tenant {view.tenant}) revoked", "id": view.id})


ROUTES = [("/keys", page(show), ["GET"]),
          ("/keys/create", page(create, admin=True, action=True), ["POST"]),
          ("/keys/revoke", page(revoke, admin=True, action=True), ["POST"])]
