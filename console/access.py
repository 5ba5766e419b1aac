"""Who may see the console, and who may act in it. The gateway's rule: while no API key exists
the console is open, on loopback only (a request from any other address is refused, even on a
gateway started with --allow-anonymous, and so is one naming any Host but a loopback one:
gateway/host_check.py); once a key exists every page needs one, sent as
``Authorization: Bearer KEY`` or kept by the login page in an HttpOnly, SameSite=Strict cookie.
What a key may do is its scope's (rules.py: an open console is its operator's own, a
cluster-admin); a metrics key sees no page. A cluster-admin sees every deployment; any other key
the deployments its tenant may use (gateway/table.py's rule), not the others.

Actions are POSTs from the console's script: they must carry ``ACTION_HEADER``, which a page on
another site cannot send without a CORS preflight this server never grants, and, where the
browser sends one, an ``Origin`` naming one of the gateway's own names (host_check.py's, never
the request's own Host, which a DNS-rebinding page chooses)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request

from contracts.scopes import ADMIN_SCOPES, CLUSTER_ADMIN
from gateway import host_check
from gateway.app import Gateway
from gateway.config import is_loopback
from console import rules
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
    scope: str  # contracts/scopes.py; the open console is a cluster-admin
    key_id: str = ""

    @property
    def admin(self) -> bool:
        """A tenant-admin or cluster-admin: may act on something (rules.py says on what)."""
        return self.scope in ADMIN_SCOPES

    @property
    def cluster_admin(self) -> bool:
        return self.scope == CLUSTER_ADMIN

    def sees(self, spec: dict[str, Any]) -> bool:
        """Whether this caller may see a deployment of ``spec``: a cluster-admin or the open console
        sees all; any other key, its tenant's deployments, those shared with it, and tenant default's."""
        if self.cluster_admin:
            return True
        tenant, shared = owner(spec)
        return tenant in (self.tenant, DEFAULT_TENANT) or self.tenant in shared or EVERYONE in shared

    def may_act_on(self, tenant: str) -> bool:
        """Whether the page offers this caller the actions on an object of ``tenant`` (rules.py decides)."""
        return self.cluster_admin or (self.admin and self.tenant == tenant)


OPEN = Caller(tenant=DEFAULT_TENANT, keyed=False, scope=CLUSTER_ADMIN)


def token_of(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.cookies.get(COOKIE, "")


async def caller(gw: Gateway, request: Request) -> Caller:
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
    why = rules.console(info.scope)
    if why:
        raise Forbidden(why)
    return Caller(tenant=info.tenant, keyed=True, scope=info.scope, key_id=info.id)


def own_names(gw: Gateway) -> frozenset[str]:
    """The names this gateway's console answers to now (host_check.py): loopback only while open."""
    s, keyed = gw.settings, gw.auth.required
    return host_check.allowed("console", keyed, s.port, s.public_names, s.host)


def origin_problem(origin: str | None, names: frozenset[str]) -> str | None:
    """Why an action's ``Origin`` is refused (None: none sent, or one of ``names`` over http(s))."""
    if origin is None:
        return None
    u = urlsplit(origin)
    if u.scheme in ("http", "https") and host_check.host_ok(u.netloc, names):
        return None
    return f"an action from another origin ({origin[:100]}) is refused"


def check_action(gw: Gateway, request: Request) -> None:
    if request.method != "POST" or request.headers.get(ACTION_HEADER) != "1":
        raise Forbidden("actions are sent by the console's own page")
    why = origin_problem(request.headers.get("origin"), own_names(gw))
    if why:
        raise Forbidden(why)
