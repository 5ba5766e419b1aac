"""The playground: chat with a deployment through the gateway's own API, streaming, and see each
answer's TTFT and tokens/s as the browser measures them (static/playground.js).

The models listed are those the caller's key may use whose engines serve the OpenAI API
(gateway/table.py ``listed_for``: what /v1/models lists for the same key). The browser cannot
read the HttpOnly key cookie, so the page posts to ``/console/playground/chat``, which hands the
request, body still streaming, to the gateway's relay as ``/v1/chat/completions`` with the
signed-in key as its Authorization: the tenant's limits, its routing, its usage and the metrics
count it exactly as any API request.
Only the headers an engine needs travel (an allowlist): never the console's cookie, which holds
the key."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from console import access
from console.web import Page, page

CHAT_PATH = "/v1/chat/completions"
KEPT = frozenset({b"host", b"content-type", b"content-length", b"accept", b"user-agent"})


def handed_scope(scope: dict, token: str) -> dict:
    """A copy of the console request's ASGI scope, as the gateway's API request it stands for:
    the chat path, no query string, the allowlisted headers and ``Authorization: Bearer token``
    (none for the open console: ``token`` empty)."""
    headers = [(k, v) for k, v in scope["headers"] if k.lower() in KEPT]
    if token:
        headers.append((b"authorization", b"Bearer " + token.encode("latin-1")))
    return {**scope, "path": CHAT_PATH, "raw_path": CHAT_PATH.encode(), "root_path": "", "query_string": b"",
            "headers": headers}


ANSWER_HEADERS = frozenset({b"content-type", b"content-length"})  # of the engine's, what the page is sent


class Handed(Response):
    """The relay's own answer, its body sent as it is (a stream stays a stream), with only the
    engine's content-type and content-length of its headers, ``cache-control: no-cache`` and the
    headers set on this one (the console's ``x-gpuflow-data-ms``). The page needs no more, and an
    engine's ``cache-control: no-store`` (llama-cpp-python's server sends it) made Chromium end each
    finished stream as ``net::ERR_ABORTED``: a failed request in the console, per answer (issue 36)."""

    def __init__(self, inner: Response):
        self.inner, self.status_code, self.raw_headers, self.background = inner, inner.status_code, [], None

    async def __call__(self, scope, receive, send) -> None:
        async def send_with(message):
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() in ANSWER_HEADERS]
                message = {**message, "headers": [*kept, (b"cache-control", b"no-cache"), *self.raw_headers]}
            await send(message)
        await self.inner(scope, receive, send_with)


async def show(con, request: Request, caller: access.Caller) -> Page:
    table = con.gw.balancer.table
    models = table.listed_for(caller.tenant, caller.keyed)  # as /v1/models lists them: OpenAI engines only
    asked = request.query_params.get("model", "")[:200]
    chosen = asked if asked in models else (models[0] if models else "")
    choices = [(n, len(table.models[n].replicas) if n in table.models else 0) for n in models]
    return Page("playground.html", {"title": "Playground", "choices": choices, "model": chosen,
                                    "unknown": asked if asked and asked not in models else ""})


async def chat(con, request: Request, caller: access.Caller) -> Response:
    token = access.token_of(request) if caller.keyed else ""
    return Handed(await con.gw.relay(Request(handed_scope(request.scope, token), request.receive)))


ROUTES = [("/playground", page(show), ["GET"]), ("/playground/chat", page(chat, action=True), ["POST"])]
