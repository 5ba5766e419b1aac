"""How a console page is served: the Jinja2 environment (every value escaped, an unknown name
an error rather than an empty string), the filters pages share, and ``page()``, which wraps a
page's handler with the access check, the time its data took and the error pages.

A handler is ``async def handler(con, request, caller) -> Page | Response``, ``con`` the
console (console/context.py ``Console``). A ``Page`` names
its template and context; ``data_ms`` (the time the handler took to gather its data, the
figure the issue's 300 ms budget is about) is shown in the footer and sent as the header
``x-gpuflow-data-ms``."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable
from urllib.parse import quote

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from console import access
from console.context import Console
from gateway.relay import TooLarge, read_body
from scheduler.errors import GpuflowError, InvalidInput

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES_DIR = os.path.join(HERE, "templates")
STATIC_DIR = os.path.join(HERE, "static")
DATA_MS = "x-gpuflow-data-ms"
log = logging.getLogger("gpuflow.console")

NAV = [("Overview", "/console/"), ("Deployments", "/console/deployments"), ("Queue", "/console/queue"),
       ("Tenants", "/console/tenants"), ("Claims", "/console/claims"), ("API keys", "/console/keys"), ("Playground", "/console/playground")]


def gib(n: int | float | None, digits: int = 1) -> str:
    """Bytes as GiB ('-' for unknown): 25769803776 -> '24.0'."""
    return "-" if n is None else f"{n / 2**30:.{digits}f}"


def ago(seconds: float | None) -> str:
    """'42 s', '3 min', '2 h', '5 d' ('-' for unknown)."""
    if seconds is None:
        return "-"
    s = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{int(s // size)} {unit}"
    return f"{int(s)} s"


def pct(part: float | None, whole: float | None) -> str:
    return "-" if part is None or not whole else f"{100 * part / whole:.0f}%"


ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES_DIR), autoescape=True,
                         undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
ENV.filters.update(gib=gib, ago=ago, pct=pct, urlpart=lambda v: quote(str(v), safe=""))


MAX_ACTION = 4096  # an action's JSON body, at most
PAGE_NUMBER = re.compile(r"^[0-9]{1,6}$")  # ASCII digits only: str.isdigit() takes '²', which int() refuses


def page_number(request: Request) -> int:
    """The ``page`` query parameter (1 when absent or not a number); each page clamps it to its pages."""
    v = request.query_params.get("page", "")
    return int(v) if PAGE_NUMBER.match(v) else 1


async def action_body(request: Request) -> dict[str, Any]:
    """An action's JSON object, at most MAX_ACTION bytes; InvalidInput (answered 400, naming it)
    otherwise. An empty body is an empty object."""
    try:
        v = json.loads(await read_body(request, MAX_ACTION) or b"{}")
    except TooLarge:
        raise InvalidInput(f"an action's body is at most {MAX_ACTION} bytes") from None
    except (ValueError, RecursionError):
        raise InvalidInput("an action's body is not JSON") from None
    if not isinstance(v, dict):
        raise InvalidInput("an action's body is not a JSON object")
    return v


@dataclass
class Page:
    template: str
    context: dict[str, Any] = field(default_factory=dict)
    status: int = 200


Handler = Callable[[Console, Request, access.Caller], Awaitable["Page | Response"]]


# scripts only from this server (no inline script runs, so an escaped name that slipped through could not
# either); inline style attributes are allowed for the bars' widths; no frames, no form posts elsewhere
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "frame-ancestors 'none'; form-action 'self'; base-uri 'none'")


def render(template: str, status: int = 200, headers: dict[str, str] | None = None, **context) -> HTMLResponse:
    r = HTMLResponse(ENV.get_template(template).render(nav=NAV, **context), status_code=status, headers=headers)
    r.headers["content-security-policy"] = CSP
    r.headers["x-content-type-options"] = "nosniff"
    r.headers["referrer-policy"] = "same-origin"
    return r


def error_page(status: int, message: str, caller: access.Caller | None = None) -> HTMLResponse:
    return render("error.html", status=status, caller=caller, title=f"{status}", message=message, data_ms=None)


def page(fn: Handler, admin: bool = False, action: bool = False) -> Callable[[Console], Callable]:
    """The route handler for ``fn``, given the console. ``admin``: only a tenant-admin or
    cluster-admin key (or an open console) may use it; ``fn`` then checks the scope against the
    object's tenant (rules.py) and raises access.Forbidden, answered 403 naming what is missing.
    ``action``: a POST from the console's own script (access.check_action: one of the gateway's
    own origins, its header), answered in JSON."""

    def bind(con: Console):
        async def handle(request: Request) -> Response:
            caller = None  # a metrics key is refused before it is a caller
            try:
                caller = await access.caller(con.gw, request)
                if action:
                    access.check_action(con.gw, request)
                if admin and not caller.admin:
                    raise access.Forbidden(f"this needs a tenant-admin or cluster-admin API key (gpuflow keys create "
                                           f"--tenant T --scope tenant-admin); yours is a {caller.scope} key")
            except access.Denied as e:
                if action or request.method != "GET":
                    return JSONResponse({"error": str(e)}, status_code=401)
                return RedirectResponse(f"/console/login?next={quote(request.url.path, safe='/')}", status_code=303)
            except access.Forbidden as e:
                return JSONResponse({"error": str(e)}, 403) if action else error_page(403, str(e), caller)
            t0 = time.perf_counter()
            try:
                out = await fn(con, request, caller)
            except InvalidInput as e:
                return JSONResponse({"error": str(e)}, 400) if action else error_page(400, str(e), caller)
            except GpuflowError as e:  # Temporal or a workflow did not answer (gpuflow.runtime.Unreachable): an outage
                return JSONResponse({"error": str(e)}, 503) if action else error_page(503, str(e), caller)
            except access.Forbidden as e:
                return JSONResponse({"error": str(e)}, 403) if action else error_page(403, str(e), caller)
            except Exception as e:  # noqa: BLE001  a page that fails says so; the gateway serves on
                log.exception("console %s failed", request.url.path)
                why = f"{type(e).__name__}: {e}"
                return JSONResponse({"error": why}, 500) if action else error_page(500, why, caller)
            ms = (time.perf_counter() - t0) * 1000
            if not isinstance(out, Page):
                out.headers[DATA_MS] = f"{ms:.1f}"
                return out
            return render(out.template, out.status, {DATA_MS: f"{ms:.1f}"}, caller=caller, data_ms=ms,
                          path=request.url.path, **out.context)
        return handle
    return bind
