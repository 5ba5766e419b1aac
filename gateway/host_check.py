"""Which ``Host`` a request may name (issue 40, M1: DNS rebinding).

A page on ``evil.example`` whose name the attacker re-points at 127.0.0.1 is, to the browser,
same-origin with itself: its script may send the console's action header, and its ``Origin``
matches its own ``Host``. What it cannot change is that both name ``evil.example``. So the
gateway answers only to the names it was given, as Jupyter's server (``allow_remote_access``) and
webpack-dev-server (``allowedHosts``) do against the same attack, and compares ``Origin`` with those
names, never with the request's own ``Host``:

- the console (``/console...``): loopback names on the gateway's port (``127.0.0.1:P``,
  ``localhost:P``, ``[::1]:P``, and the address it listens on) and, once a key exists, the
  ``--public-name`` ones; while no key exists (the console is open), loopback names only;
- the API and ``/metrics`` while the gateway is open (no key exists) and not started with
  ``--allow-anonymous``: loopback and public names. An open gateway trusts whoever reaches
  loopback, and a rebinding page reaches it through the victim's browser;
- once a key exists, the API and ``/metrics`` answer to any Host: a bearer key is not an ambient
  credential (the browser never adds one by itself), so a rebinding page holds none;
- ``/healthz`` answers to any Host (load balancers probe it by address).

A refused request gets 421 Misdirected Request, naming the names this gateway answers to."""

from __future__ import annotations

import json

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
MISDIRECTED = 421
CONSOLE = "/console"


WILDCARDS = ("", "0.0.0.0", "::")


def loopback(port: int, listen: str = "127.0.0.1") -> frozenset[str]:
    """``127.0.0.1:P``, ``localhost:P``, ``[::1]:P`` and the address the gateway listens on (unless
    every address: no page can name an address as its own host); the bare names too on port 80
    (a browser leaves the scheme's port out of ``Host``)."""
    names = set(LOOPBACK_NAMES)
    if listen not in WILDCARDS:
        names.add(f"[{listen}]" if ":" in listen else listen.lower())
    return frozenset({f"{n}:{port}" for n in names} | (names if port == 80 else set()))


def public(names: tuple[str, ...], port: int) -> frozenset[str]:
    """The ``--public-name`` entries, lower-cased: ``NAME:PORT`` as given; a bare ``NAME`` as
    itself (a proxy on the scheme's port) and on the gateway's port."""
    out: set[str] = set()
    for n in names:
        n = n.lower()
        out.add(n)
        if not n.rsplit("]", 1)[-1].count(":"):  # no port given
            out.add(f"{n}:{port}")
    return frozenset(out)


def guarded(path: str, keyed: bool, allow_anonymous: bool) -> str | None:
    """Which names apply to a request for ``path``: "console" (the console's names), "api"
    (loopback and public), or None (any Host). ``keyed``: a key exists."""
    if path == CONSOLE or path.startswith(CONSOLE + "/"):
        return "console"
    if keyed or allow_anonymous or path == "/healthz":
        return None
    return "api"


def allowed(kind: str, keyed: bool, port: int, public_names: tuple[str, ...],
            listen: str = "127.0.0.1") -> frozenset[str]:
    """The Host values a request of ``kind`` may name."""
    if kind == "console" and not keyed:
        return loopback(port, listen)
    return loopback(port, listen) | public(public_names, port)


def host_ok(host: str | None, names: frozenset[str]) -> bool:
    """Whether ``host`` (the request's Host header) is one of ``names`` (DNS names are case-insensitive)."""
    return bool(host) and host.strip().lower() in names


def refusal(host: str | None, names: frozenset[str], keyed: bool, kind: str = "console") -> str:
    """What a refused request is told."""
    how = ("no API key exists yet, so the console answers to loopback names only" if kind == "console" and not keyed
           else "add --public-name NAME[:PORT] to 'gpuflow gateway' for another name")
    return (f"This gateway does not answer to Host {str(host or '')[:100]!r}: it answers to "
            f"{', '.join(sorted(names))} ({how}).")


class HostGuard:
    """ASGI middleware: each HTTP request checked by the rule above before the app sees it."""

    def __init__(self, app, gw):
        self.app, self.gw = app, gw
        s = gw.settings
        self.names = {(kind, keyed): allowed(kind, keyed, s.port, s.public_names, s.host)
                      for kind in ("console", "api") for keyed in (False, True)}

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            keyed = self.gw.auth.required
            kind = guarded(scope["path"], keyed, self.gw.settings.allow_anonymous)
            if kind is not None:
                host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), None)
                names = self.names[(kind, keyed)]
                if not host_ok(host, names):
                    await _refuse(send, kind, refusal(host, names, keyed, kind))
                    return
        await self.app(scope, receive, send)


async def _refuse(send, kind: str, message: str) -> None:
    if kind == "console":
        body, ctype = message.encode(), b"text/plain; charset=utf-8"
    else:  # the API's clients read OpenAI's error JSON
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                     "code": "misdirected_request"}}).encode()
        ctype = b"application/json"
    await send({"type": "http.response.start", "status": MISDIRECTED,
                "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode()),
                            (b"x-content-type-options", b"nosniff")]})
    await send({"type": "http.response.body", "body": body})
