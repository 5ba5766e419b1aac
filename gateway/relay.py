"""One request through the gateway: pick a replica (or wait for one), send the body unchanged,
retry elsewhere while nothing has reached the client, then relay the answer chunk by chunk.
A client that goes away cancels its request wherever it is (queued, waiting, relaying)."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from starlette.requests import Request
from starlette.responses import Response

from store.serving import Route
from gateway import errors
from gateway.balance import Prompt, QueueFull, QueueTimeout, UnknownModel
from gateway.metrics import SSEWatch
from gateway.stream_tokens import stream_usage
from gateway.upstream import (Broken, ConnectTimeout, FirstByteTimeout, IdleTimeout, Reset, UpstreamError, request_headers,
                              to_engine)

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


class Disconnect:
    """Cancels the request's task when its client disconnects, until ``stop()``."""

    def __init__(self, receive):
        self.fired = self.stopped = False
        self.task = asyncio.current_task()
        self.watcher = asyncio.create_task(self._watch(receive))

    async def _watch(self, receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if not self.stopped:
            self.fired = True
            self.task.cancel()

    def stop(self) -> None:
        self.stopped = True
        self.watcher.cancel()


async def forward(gw, request: Request, t0: float, tenant: str, body: bytes, model: str, stream: bool,
                  watch: Disconnect, keyed: bool = True, prompt: Prompt | None = None) -> Response:
    """Send ``body`` to a replica of ``model``; the answer (a Relay, which then owns the replica's
    slot and ``watch``), or the error a client should see. ``prompt`` (its blocks) guides the
    choice of replica, and holds the choice made."""
    bal, s = gw.balancer, gw.settings
    exclude: frozenset[str] = frozenset()
    q = request.scope.get("query_string")
    path = request.scope["path"] + (f"?{q.decode('latin-1')}" if q else "")
    headers = request_headers(request.headers.raw)
    priority, arrival = gw.limits.priority(tenant), time.monotonic()  # a retry keeps its place in the queue
    for attempt in range(s.attempts):
        last = attempt + 1 == s.attempts
        try:
            route, waited = await bal.acquire(model, exclude, priority, arrival, prompt)
        except QueueFull:
            return errors.queue_full(model, bal.depth(model))
        except QueueTimeout:
            return errors.no_replica(model, s.queue_timeout_s)
        except UnknownModel:  # deleted while this request waited: the models the caller may use, no others
            return errors.unknown_model(model, bal.table.listed_for(tenant, keyed))
        gw.metrics.queue_wait.labels(model).observe(waited)
        if prompt is not None and prompt.choice is not None:
            gw.metrics.route(model, prompt.choice)
        gw.metrics.in_flight.labels(model).inc()
        try:
            resp, first = await _open(gw, route, f"http://{route.address}:{route.port}{path}",
                                      to_engine(headers, route.engine_key), body,
                                      not last and bal.untried(model, exclude | {route.instance}))
        except BaseException as e:
            gw.metrics.in_flight.labels(model).dec()
            bal.release(route, model)
            if not isinstance(e, UpstreamError):
                raise
            if e.bad:
                bal.mark_bad(route)
            if isinstance(e, (FirstByteTimeout, IdleTimeout)):
                return errors.timeout(model, str(e))
            if not last and bal.untried(model, exclude | {route.instance}):
                exclude = exclude | {route.instance}
                continue
            if e.retry and not e.bad and not last:
                continue  # a pooled connection closed under us: the same replica again
            if isinstance(e, ConnectTimeout):
                return errors.timeout(model, str(e))
            return errors.unreachable(model, str(e))
        return Relay(gw, route, model, tenant, t0, resp, first, stream, watch)
    return errors.unreachable(model, f"{s.attempts} attempts failed")


async def _open(gw, route: Route, url: str, headers: dict[str, str], body: bytes, others: bool):
    """The replica's answer and its first bytes, read before the client sees anything (so that
    a failure up to here can still be retried elsewhere)."""
    resp = await gw.client.open(url, headers, body)
    try:
        if resp.status == 401:  # the engine refused the key the gateway showed: its own, never the client's fault
            gw.balancer.mark_bad(route)
            log.warning("gateway: %s (%s:%s) refused its engine key (401): a key the store did not make for it, "
                        "or its host is not joined", route.instance, route.address, route.port)
            raise UpstreamError(f"{route.instance} refused the gateway's engine key")
        if resp.status >= 500 and others:  # the replica failed; nobody saw it yet
            gw.balancer.mark_bad(route)
            raise UpstreamError(f"{route.instance} answered {resp.status}")
        try:
            return resp, await resp.chunk()
        except Broken as e:
            raise Reset(str(e)) from None
    except BaseException:
        await resp.close()
        raise


class Relay(Response):
    """The replica's answer, relayed as it arrives (never buffered whole), measured on the way;
    the replica's slot is released when the last byte went out or the client left."""

    def __init__(self, gw, route: Route, model: str, tenant: str, t0: float, resp, first: bytes, stream: bool,
                 watch: Disconnect):
        self.gw, self.route, self.model, self.tenant, self.t0 = gw, route, model, tenant, t0
        self.resp, self.first, self.watch = resp, first, watch
        ctype = next((v for k, v in resp.headers if k == b"content-type"), b"")
        self.sse = SSEWatch() if stream or ctype.startswith(b"text/event-stream") else None
        self.keep = ctype.startswith(b"application/json") and self.sse is None
        length = next((v for k, v in resp.headers if k == b"content-length"), None)
        self.length = int(length) if length is not None and length.isdigit() else None
        self.status_code = resp.status
        self.background = None
        self.cold = False  # set by the gateway: the request arrived with no replica (gateway/wake.py)
        self.extra_headers: list[tuple[bytes, bytes]] = []  # set by the gateway: x-gpuflow-route when asked
        self.admitted = False  # set by the gateway: the tenant's admission (tenant_limits.py) ends with this answer
        self.key_id = ""  # set by the gateway: the caller's key, which its usage is counted under
        self.hide = None  # set by the gateway: a HideUsage when it asked for the stream's usage (stream_usage.py)
        self.asked = None  # set by the gateway: (the request's JSON, chat?, its prompt's ids or None), to count a
        #                    stream that brings no usage (stream_tokens.py)

    async def __call__(self, scope, receive, send) -> None:
        m, kept, last_content, n_kept, sent = self.gw.metrics, [], None, 0, 0
        code = str(self.resp.status)
        try:
            await send({"type": "http.response.start", "status": self.resp.status,
                        "headers": self.resp.headers + self.extra_headers if self.extra_headers else self.resp.headers})
            if self.cold and self.sse is None:
                m.cold_start.labels(self.model).observe(time.perf_counter() - self.t0)
            chunk = self.first
            while chunk:
                n = self.sse.feed(chunk) if self.sse is not None else 0
                if n:  # content events; several in one read reach the client together (gaps of 0)
                    now = time.perf_counter()
                    if last_content is None:
                        m.ttft.labels(self.model).observe(now - self.t0)
                        if self.cold:
                            m.cold_start.labels(self.model).observe(now - self.t0)
                    else:
                        m.itl.labels(self.model).observe(now - last_content)
                    for _ in range(n - 1):
                        m.itl.labels(self.model).observe(0.0)
                    last_content = now
                elif self.keep and n_kept < KEEP_JSON:
                    kept.append(chunk)
                    n_kept += len(chunk)
                out = chunk if self.hide is None else self.hide.feed(chunk)
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                    sent += len(out)
                chunk = await self.resp.chunk()
            if self.hide is not None and (out := self.hide.end()):
                await send({"type": "http.response.body", "body": out, "more_body": True})
            self.watch.stop()  # from here a disconnect is the normal end
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not self.watch.fired:
                raise
            asyncio.current_task().uncancel()
            # the client went away: the replica's connection is closed, its work stops. A client that
            # had the whole answer may hang up before the replica's end (the openai client closes a
            # stream at its [DONE]): that answer was served
            code = code if self.complete(sent) else "499"
        except UpstreamError as e:
            # bytes have reached the client: the failure is not hidden, the connection ends unfinished
            code = "504" if isinstance(e, IdleTimeout) else "502"
            log.warning("gateway: %s (%s:%s) broke off an answer for %s: %s", self.route.instance,
                        self.route.address, self.route.port, self.model, e)
        finally:
            self.watch.stop()
            if self.admitted:
                self.gw.limits.done(self.tenant)
            await self.resp.close()
            self.gw.balancer.release(self.route, self.model)
            m.in_flight.labels(self.model).dec()
            m.requests.labels(self.model, self.tenant, code).inc()
            m.duration.labels(self.model).observe(time.perf_counter() - self.t0)
            self._usage(kept)

    def complete(self, sent: int) -> bool:
        """Whether the client has been sent the whole answer: a stream's ``[DONE]``, or every byte
        its content-length announced."""
        if self.sse is not None and self.sse.done:
            return True
        return self.length is not None and sent >= self.length

    def _usage(self, kept: list[bytes]) -> None:
        usage = self.sse.usage if self.sse is not None else None
        if usage is None and self.sse is not None and self.asked is not None and self.resp.status == 200:
            self.gw.usage.later(self._count_stream())  # its prompt is tokenized off the event loop
            return
        if kept and usage is None:
            try:
                usage = json.loads(b"".join(kept)).get("usage")
            except (ValueError, AttributeError):
                usage = None
        self._count(usage)

    async def _count_stream(self) -> None:
        """A stream that carried no usage, counted from what it carried (gateway/stream_tokens.py)."""
        data, chat, ids = self.asked
        m = self.gw.balancer.table.models.get(self.model)
        source = m.tokenizer if m is not None else None
        tokenizers = self.gw.caches.tokenizers
        tokenizers.want(source)  # for this deployment's next streams, where this gateway may load it
        usage, estimated = await stream_usage(tokenizers.get(source), data, chat, self.gw.settings.max_prompt_chars,
                                              ids, self.sse.pieces)
        self._count(usage, estimated)

    def _count(self, usage, estimated: int = 0) -> None:
        self.gw.metrics.usage(self.model, usage, estimated)
        self.gw.usage.count(time.time(), self.key_id, self.tenant, self.model, usage, estimated)
