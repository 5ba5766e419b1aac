"""One request through the gateway: pick a replica (or wait for one), send the body unchanged,
retry elsewhere while nothing has reached the client, then relay the answer chunk by chunk."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from starlette.requests import Request
from starlette.responses import Response

from activities.store.serving import Route
from gateway import errors
from gateway.balance import QueueFull, QueueTimeout, UnknownModel
from gateway.metrics import SSEWatch
from gateway.upstream import Broken, FirstByteTimeout, IdleTimeout, Reset, UpstreamError, request_headers

log = logging.getLogger("gpuflow.gateway")
KEEP_JSON = 4 << 20  # a plain answer is also kept (up to this) to read its usage


class TooLarge(Exception):
    pass


async def read_body(request: Request, limit: int) -> bytes:
    n = request.headers.get("content-length")
    if n is not None and n.isdigit() and int(n) > limit:
        raise TooLarge
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise TooLarge
        parts.append(part)
    return b"".join(parts)


async def forward(gw, request: Request, t0: float, tenant: str, body: bytes, model: str, stream: bool) -> Response:
    """Send ``body`` to a replica of ``model``; the answer, or the error a client should see."""
    bal, s = gw.balancer, gw.settings
    exclude: frozenset[str] = frozenset()
    path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    headers = request_headers(request.headers.raw)
    for attempt in range(s.attempts):
        last = attempt + 1 == s.attempts
        try:
            route, waited = await bal.acquire(model, exclude)
        except QueueFull:
            return errors.queue_full(model, bal.depth(model))
        except QueueTimeout:
            return errors.no_replica(model, s.queue_timeout_s)
        except UnknownModel:
            return errors.unknown_model(model, bal.table.names())
        gw.metrics.queue_wait.labels(model).observe(waited)
        gw.metrics.in_flight.labels(model).inc()
        resp = None
        try:
            resp = await gw.client.open(f"http://{route.address}:{route.port}{path}", headers, body)
            others = not last and bal.untried(model, exclude | {route.instance})
            if resp.status >= 500 and others:  # the replica failed; nobody saw it yet
                bal.mark_bad(route)
                raise UpstreamError(f"status {resp.status}")
            try:
                first = await resp.chunk()
            except Broken as e:
                raise Reset(str(e)) from None
        except UpstreamError as e:
            if resp is not None:
                await resp.close()
            gw.metrics.in_flight.labels(model).dec()
            bal.release(route, model)
            others = not last and bal.untried(model, exclude | {route.instance})
            if e.bad:
                bal.mark_bad(route)
            if isinstance(e, (FirstByteTimeout, IdleTimeout)):
                return errors.timeout(model, str(e))
            if others:
                exclude = exclude | {route.instance}
                continue
            if e.retry and not e.bad and not last:
                continue  # a stale pooled connection: the same replica again
            return errors.unreachable(model, str(e))
        return Relay(gw, route, model, tenant, t0, resp, first, stream)
    return errors.unreachable(model, f"{s.attempts} attempts failed")


class Relay(Response):
    """The replica's answer, relayed as it arrives (never buffered whole), measured on the way;
    the replica's slot is released when the last byte went out or the client left."""

    def __init__(self, gw, route: Route, model: str, tenant: str, t0: float, resp, first: bytes, stream: bool):
        self.gw, self.route, self.model, self.tenant, self.t0 = gw, route, model, tenant, t0
        self.resp, self.first = resp, first
        ctype = next((v for k, v in resp.headers if k == b"content-type"), b"")
        self.sse = SSEWatch() if stream or ctype.startswith(b"text/event-stream") else None
        self.keep = ctype.startswith(b"application/json") and self.sse is None
        self.status_code = resp.status
        self.background = None

    async def __call__(self, scope, receive, send) -> None:
        self.done = False
        watcher = asyncio.create_task(self._cancel_on_disconnect(receive, asyncio.current_task()))
        m, kept, last_content, n_kept = self.gw.metrics, [], None, 0
        code = str(self.resp.status)
        try:
            await send({"type": "http.response.start", "status": self.resp.status, "headers": self.resp.headers})
            chunk = self.first
            while chunk:
                if self.sse is not None and self.sse.feed(chunk):
                    now = time.perf_counter()
                    if last_content is None:
                        m.ttft.labels(self.model).observe(now - self.t0)
                    else:
                        m.itl.labels(self.model).observe(now - last_content)
                    last_content = now
                elif self.keep and n_kept < KEEP_JSON:
                    kept.append(chunk)
                    n_kept += len(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                chunk = await self.resp.chunk()
            self.done = True  # from here a disconnect is the normal end
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            code = "499"  # the client went away; the replica's connection is closed, its work stops
            raise
        except UpstreamError as e:
            # bytes have reached the client: the failure is not hidden, the connection ends unfinished
            code = "504" if isinstance(e, IdleTimeout) else "502"
            log.warning("gateway: %s (%s) broke off an answer for %s: %s", self.route.instance,
                        f"{self.route.address}:{self.route.port}", self.model, e)
        finally:
            watcher.cancel()
            await self.resp.close()
            self.gw.balancer.release(self.route, self.model)
            m.in_flight.labels(self.model).dec()
            m.requests.labels(self.model, self.tenant, code).inc()
            m.duration.labels(self.model).observe(time.perf_counter() - self.t0)
            self._usage(kept)

    def _usage(self, kept: list[bytes]) -> None:
        usage = self.sse.usage if self.sse is not None else None
        if kept and usage is None:
            try:
                usage = json.loads(b"".join(kept)).get("usage")
            except (ValueError, AttributeError):
                usage = None
        self.gw.metrics.usage(self.model, usage)

    async def _cancel_on_disconnect(self, receive, task: asyncio.Task) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                if not self.done:
                    task.cancel()
                return
