"""Signing in to the console and out: the login page takes an API key and keeps it in an
HttpOnly, SameSite=Strict cookie scoped to /console (access.py reads it); after it, the browser
goes back to the console page it came from, never elsewhere."""

from __future__ import annotations

from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from console import access, rules
from console.web import render
from gateway.relay import TooLarge, read_body

def _next(v: str) -> str:
    """Where to go after signing in: a console path only (no other site, no scheme)."""
    return v if v.startswith("/console/") and not v.startswith("//") and "\\" not in v else "/console/"


def _login_page(message: str = "", nxt: str = "/console/", status: int = 200) -> HTMLResponse:
    return render("login.html", status=status, caller=None, message=message, next=nxt, data_ms=None,
                  title="Sign in")


MAX_FORM = 4096


async def small_form(request: Request) -> dict[str, str]:
    """A small urlencoded form's fields (the first value of each); an empty dict for anything
    else or anything larger than MAX_FORM bytes."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return {}
    try:
        body = await read_body(request, MAX_FORM)
    except TooLarge:
        return {}
    try:
        fields = parse_qs(body.decode("utf-8", "replace"), max_num_fields=8)
    except ValueError:  # more than 8 fields: not the sign-in form
        return {}
    return {k: v[0] for k, v in fields.items()}


def login(con):
    async def handle(request: Request) -> Response:
        if request.method == "GET":
            return _login_page(nxt=_next(request.query_params.get("next", "/console/")))
        form = await small_form(request)
        token, nxt = form.get("key", "").strip()[:200], _next(form.get("next", "/console/"))
        if not con.gw.auth.required:
            return RedirectResponse(nxt, status_code=303)
        info = await con.gw.auth.identify(token) if token else None
        if info is None:
            return _login_page("That is not a valid API key (or it was revoked).", nxt, 401)
        why = rules.console(info.scope)
        if why:
            return _login_page(f"API key {info.id}: {why}.", nxt, 403)
        r = RedirectResponse(nxt, status_code=303)
        r.set_cookie(access.COOKIE, token, httponly=True, samesite="strict", path="/console")
        return r
    return handle


def logout(con):
    async def handle(request: Request) -> Response:
        r = RedirectResponse("/console/login", status_code=303)
        r.delete_cookie(access.COOKIE, path="/console")
        return r
    return handle


ROUTES = [("/login", login, ["GET", "POST"]), ("/logout", logout, ["POST"])]
