"""One request through the gateway: pick a replica (or wait for one), send the body unchanged,
retry elsewhere while nothing has reached the client, then relay the answer chunk by chunk.
A client that goes away cancels its request wherever it is (queued, waiting, relaying).

The request path is handed what it needs, typed, and nothing more: :class:`Serving`, the parts of
the gateway it works with (made once its client to the replicas is open), and :class:`Ask`, one
admitted request. :func:`forward` returns the answer a client should see: an error, or a
:class:`Relay`, made whole (it owns the replica's slot, the tenant's, and the client's watch)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from store.serving import Route
from gateway import errors
from gateway.balance import Balancer, Prompt, QueueFull, QueueTimeout, UnknownModel
from gateway.cache_aware import LEAST_OUTSTANDING
from gateway.metrics import Metrics, SSEWatch
from gateway.prompt_tokens import Tokenizers
from gateway.stream_tokens import stream_usage
from gateway.stream_usage import HideUsage
from gateway.tenant_limits import Limits
from gateway.upstream import (Broken, Client, ConnectTimeout, FirstByteTimeout, IdleTimeout, Reset, UpstreamError,
                              request_headers, to_engine)
from gateway.usage_counter import UsageCounter, tokens

log = logging.getLogger("gpuflow.gateway")
KEEP_JSON = 4 << 20  # a plain answer is also kept (up to this) to read its usage


class TooLarge(Exception):
    pass


ROUTE = b"x-gpuflow-route"  # the routing decision, for a request that asked (gateway/cache_aware.py ``header``)


@dataclass(frozen=True, slots=True)
class Serving:
    """What the request path needs of its gateway (gateway/app.py makes it once the client to the
    replicas is open): where replicas are chosen and released, the connection pools, the tenants'
    admission (whose slot ends with the answer), the counters it adds to, and the tokenizers a
    stream that brings no usage is counted with."""

    balancer: Balancer
    client: Client  # gateway/upstream.py
    limits: Limits  # gateway/tenant_limits.py
    usage: UsageCounter
    metrics: Metrics
    tokenizers: Tokenizers
    attempts: int  # replicas tried per request
    queue_timeout_s: float  # how long a request waits for a free replica (said in the 503)
    max_prompt_chars: int  # of a prompt, tokenized at most


@dataclass(frozen=True, slots=True)
class Ask:
    """One admitted request on its way: whose it is, for which deployment, and what its answer
    must carry."""

    model: str
    tenant: str
    keyed: bool  # it showed a key (a deployment it may not use is answered with those it may)
    key_id: str  # its usage is counted under this key
    t0: float  # time.perf_counter() at its arrival
    stream: bool  # it asked for a stream
    prompt: Prompt  # its blocks guide the choice of replica, and hold the choice made
    cold: bool = False  # no replica was up when it arrived (gateway/wake.py): its first token is a cold start
    show_route: bool = False  # it asked (x-gpuflow-debug: route) for the routing decision in a header
    hide_usage: bool = False  # the gateway asked its stream for the usage the client did not ask for
    asked: tuple | None = None  # (its JSON, chat?, its prompt's token ids or None): to count a stream without usage


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


async def forward(sv: Serving, request: Request, ask: Ask, body: bytes, watch: Disconnect) -> Response:
    """Send ``body`` to a replica of ``ask.model``; the answer (a Relay, which then owns the
    replica's slot, the tenant's and ``watch``), or the error a client should see."""
    bal, model, prompt = sv.balancer, ask.model, ask.prompt
    exclude: frozenset[str] = frozenset()
    q = request.scope.get("query_string")
    path = request.scope["path"] + (f"?{q.decode('latin-1')}" if q else "")
    headers = request_headers(request.headers.raw)
    priority, arrival = sv.limits.priority(ask.tenant), time.monotonic()  # a retry keeps its place in the queue
    for attempt in range(sv.attempts):
        last = attempt + 1 == sv.attempts
        try:
            route, waited = await bal.acquire(model, exclude, priority, arrival, prompt)
        except QueueFull:
            return errors.queue_full(model, bal.depth(model))
        except QueueTimeout:
            return errors.no_replica(model, sv.queue_timeout_s)
        except UnknownModel:  # deleted while this request waited: the models the caller may use, no others
            return errors.unknown_model(model, bal.table.listed_for(ask.tenant, ask.keyed))
        sv.metrics.queue_wait.labels(model).observe(waited)
        if prompt.choice is not None:
            sv.metrics.route(model, prompt.choice)
        sv.metrics.in_flight.labels(model).inc()
        sent = time.perf_counter()  # the replica's first-token time is measured from here (Pace)
        try:
            resp, first = await _open(sv, route, f"http://{route.address}:{route.port}{path}",
                                      to_engine(headers, route.engine_key), body,
                                      not last and bal.untried(model, exclude | {route.instance}))
        except BaseException as e:
            sv.metrics.in_flight.labels(model).dec()
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
        return Relay(sv, ask, route, resp, first, watch, sent)
    return errors.unreachable(model, f"{sv.attempts} attempts failed")


async def _open(sv: Serving, route: Route, url: str, headers: dict[str, str], body: bytes, others: bool):
    """The replica's answer and its first bytes, read before the client sees anything (so that
    a failure up to here can still be retried elsewhere)."""
    resp = await sv.client.open(url, headers, body)
    try:
        if resp.status == 401:  # the engine refused the key the gateway showed: its own, never the client's fault
            sv.balancer.mark_bad(route)
            log.warning("gateway: %s (%s:%s) refused its engine key (401): a key the store did not make for it, "
                        "or its host is not joined", route.instance, route.address, route.port)
            raise UpstreamError(f"{route.instance} refused the gateway's engine key")
        if resp.status >= 500 and others:  # the replica failed; nobody saw it yet
            sv.balancer.mark_bad(route)
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
    the replica's slot and the tenant's are released when the last byte went out or the client
    left. Whole when made: nothing of it is set afterwards."""

    def __init__(self, sv: Serving, ask: Ask, route: Route, resp, first: bytes, watch: Disconnect,
                 sent: float | None = None):
        self.sv, self.ask, self.route, self.model, self.t0 = sv, ask, route, ask.model, ask.t0
        self.sent = sent  # when the request went to the replica
        self.resp, self.first, self.watch = resp, first, watch
        ctype = next((v for k, v in resp.headers if k == b"content-type"), b"")
        self.sse = SSEWatch() if ask.stream or ctype.startswith(b"text/event-stream") else None
        self.keep = ctype.startswith(b"application/json") and self.sse is None
        length = next((v for k, v in resp.headers if k == b"content-length"), None)
        self.length = int(length) if length is not None and length.isdigit() else None
        self.status_code = resp.status
        self.background = None
        # the stream's usage the gateway asked for, hidden from a client that did not (stream_usage.py)
        self.hide = HideUsage() if ask.hide_usage and resp.status == 200 else None
        choice = ask.prompt.pick or ask.prompt.choice  # a group's ends (gateway/pd_pick.py), or the replica
        self.extra_headers = ([(ROUTE, choice.header().encode("latin-1", "replace"))]
                              if ask.show_route and choice is not None else [])

    async def __call__(self, scope, receive, send) -> None:
        m, kept, last_content, n_kept, sent = self.sv.metrics, [], None, 0, 0
        code = str(self.resp.status)
        try:
            await send({"type": "http.response.start", "status": self.resp.status,
                        "headers": self.resp.headers + self.extra_headers if self.extra_headers else self.resp.headers})
            if self.ask.cold and self.sse is None:
                m.cold_start.labels(self.model).observe(time.perf_counter() - self.t0)
            chunk = self.first
            while chunk:
                n = self.sse.feed(chunk) if self.sse is not None else 0
                if n:  # content events; several in one read reach the client together (gaps of 0)
                    now = time.perf_counter()
                    if last_content is None:
                        m.ttft.labels(self.model).observe(now - self.t0)
                        self._paced(now)
                        if self.ask.cold:
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
            self.sv.limits.done(self.ask.tenant, self.ask.key_id)  # its admission (tenant_limits.py) ends with this answer
            await self.resp.close()
            self.sv.balancer.release(self.route, self.model)
            m.in_flight.labels(self.model).dec()
            m.requests.labels(self.model, self.ask.tenant, code).inc()
            m.duration.labels(self.model).observe(time.perf_counter() - self.t0)
            self._usage(kept)

    def complete(self, sent: int) -> bool:
        """Whether the client has been sent the whole answer: a stream's ``[DONE]``, or every byte
        its content-length announced."""
        if self.sse is not None and self.sse.done:
            return True
        return self.length is not None and sent >= self.length

    def _paced(self, now: float) -> None:
        """The replica's first token, measured from when the request went to it, tells the
        balancer what a request ahead and an uncached block cost there (cache_aware.Pace): for a
        request routed by cache to a single replica, with its load and unmatched blocks then."""
        c, p = self.ask.prompt.choice, self.ask.prompt
        if (self.sent is not None and c is not None and c.blocks and p.pick is None
                and c.reason != LEAST_OUTSTANDING and c.route.instance == self.route.instance):
            self.sv.balancer.pace.observe(c.route.instance, c.load, c.blocks - c.matched, now - self.sent)

    def _usage(self, kept: list[bytes]) -> None:
        usage = self.sse.usage if self.sse is not None else None
        if usage is None and self.sse is not None and self.ask.asked is not None and self.resp.status == 200:
            self.sv.usage.later(self._count_stream())  # its prompt is tokenized off the event loop
            return
        if kept and usage is None:
            try:
                usage = json.loads(b"".join(kept)).get("usage")
            except (ValueError, AttributeError):
                usage = None
        if usage is not None and self.resp.status == 200:  # its cached tokens correct the prefix index
            p = self.ask.prompt
            self.sv.balancer.answered(self.route.instance, p, usage, p.chars < self.sv.max_prompt_chars)
        self._count(usage)

    async def _count_stream(self) -> None:
        """A stream that carried no usage, counted from what it carried (gateway/stream_tokens.py)."""
        data, chat, ids = self.ask.asked
        m = self.sv.balancer.table.models.get(self.model)
        source = m.tokenizer if m is not None else None
        tokenizers = self.sv.tokenizers
        tokenizers.want(source)  # for this deployment's next streams, where this gateway may load it
        usage, estimated = await stream_usage(tokenizers.get(source), data, chat, self.sv.max_prompt_chars,
                                              ids, self.sse.pieces)
        self._count(usage, estimated)

    def _count(self, usage, estimated: int = 0) -> None:
        self.sv.metrics.usage(self.model, usage, estimated)
        self.sv.usage.count(time.time(), self.ask.key_id, self.ask.tenant, self.model, usage, estimated)
        self.sv.limits.spend(self.ask.tenant, self.ask.key_id, sum(tokens(usage)))  # tokens_per_min
