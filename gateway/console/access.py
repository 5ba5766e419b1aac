"""Who may see the console, and who may act in it. The gateway's rule: while no API key exists
the console is open, on loopback only (a request from any other address is refused, even on a
gateway started with --allow-anonymous); once a key exists every page needs one, sent as
``Authorization: Bearer KEY`` or kept by the login page in an HttpOnly, SameSite=Strict cookie.
Actions and key management need a key created with ``--admin`` (an open console is its
operator's own: it may act). A non-admin key sees the deployments its tenant may use
(gateway/table.py's rule), not the others.

Actions are POSTs from the console's script: they must carry ``ACTION_HEADER``, which a page on
another site cannot send without a CORS preflight this server never grants, and, where the
browser sends one, an ``Origin`` naming this server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request

from gateway.config import is_loopback
from gateway.table import EVERYONE, DEFAULT_TENANT, owner

COOKIE = "gpuflow_console"
ACTION_HEADER = "x-gpuflow-console"


class Denied(Exception):
    """No valid key (or not on loopback while the console is open): sign in."""


class Forbidden(Exception):
    """A valid key that may not do this."""


@dataclass(frozen=True)
class Caller:
    tenant: str
    keyed: bool  # a key named the caller (False: the open console)
    admin: bool
    key_id: str = ""

    def sees(self, spec: dict[str, Any]) -> bool:
        """Whether this caller may see a deployment of ``spec``: an admin or the open console sees all;
        a tenant's key, its tenant's deployments, those shared with it, and tenant default's."""
        if self.admin or not self.keyed:
            return True
        tenant, shared = owner(spec)
        return tenant in (self.tenant, DEFAULT_TENANT) or self.tenant in shared or EVERYONE in shared


OPEN = Caller(tenant=DEFAULT_TENANT, keyed=False, admin=True)


def token_of(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.cookies.get(COOKIE, "")


async def caller(gw, request: Request) -> Caller:
    if not gw.auth.required:
        host = request.client.host if request.client else ""
        if is_loopback(host):
            return OPEN
        raise Denied("no API key exists yet, so the console answers on loopback only")
    token = token_of(request)
    if not token:
        raise Denied("sign in with an API key")
    info = await gw.auth.identify(token)  # the gateway's own cached verdict (gateway/auth.py)
    if info is None:
        raise Denied("invalid or revoked API key")
    return Caller(tenant=info.tenant, keyed=True, admin=info.admin, key_id=info.id)


def check_action(request: Request) -> None:
    if request.method != "POST" or request.headers.get(ACTION_HEADER) != "1":
        raise Forbidden("actions are sent by the console's own page")
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host", ""):
        raise Forbidden(f"an action from another origin ({origin[:100]}) is refused")
