"""One request of a prefill/decode group through the gateway (its router: no extra process). The
balancer picks the ends (gateway/pd_pick.py); this speaks the hand-off (gateway/pd_protocol.py)
and retries before the client has seen a byte:

- a prefill that fails (unreachable, an error, an answer with no usable kv_transfer_params) -> the
  request again with another prefill (the failed one left out; none left: the decode serves it
  whole, a *fallback*);
- a decode that is down (unreachable, reset) -> another decode with the same kv_transfer_params
  (the prefill still holds the KV: it was not pulled);
- a decode that answers an error (its KV pull failed: a 5xx or 409) -> the request again from its
  prefill on, that prefill left out (its KV is what failed) and marked bad for ``bad_s``.

Every failed end counts in ``gpuflow_gateway_pd_transfer_failures_total{end}``, every request
handed to a decode in ``gpuflow_gateway_pd_requests_total{path}``. A client's error (a 4xx from
the prefill) is its answer, not retried."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from starlette.requests import Request
from starlette.responses import Response

from store.serving import Route
from gateway import errors
from gateway.balance import QueueFull, QueueTimeout, UnknownModel
from gateway.pd_pick import DECODE, DISAGGREGATED, PREFILL, SGLANG, Pick, protocol_of
from gateway.pd_protocol import MAX_ANSWER, BadAnswer, bootstrap_body, decode_body, prefill_answer, prefill_body
from gateway.relay import Ask, Disconnect, Relay, Serving
from gateway.upstream import Broken, ConnectFailed, FirstByteTimeout, IdleTimeout, UpstreamError, request_headers, \
    to_engine

log = logging.getLogger("gpuflow.gateway")
KV_FAILED = 409  # a stand-in decode's "this KV is another prompt's"; every 5xx is a failed pull too
draining: set[asyncio.Task] = set()  # SGLang prefills' answers read in the background (kept referenced)


class EndFailed(Exception):
    """One end failed before the client saw a byte: ``end`` prefill|decode; ``down``: unreachable."""

    def __init__(self, end: str, route: Route, why: str, down: bool = False):
        super().__init__(f"{end} {route.instance}: {why}")
        self.end, self.route, self.down = end, route, down


class ClientError(Exception):
    """A prefill's 4xx: the request's own fault; the client gets it as it came."""

    def __init__(self, status: int, body: bytes, ctype: bytes):
        self.status, self.body, self.ctype = status, body, ctype


def url(r: Route, path: str) -> str:
    return f"http://{r.address}:{r.port}{path}"


async def open_end(sv: Serving, end: str, r: Route, path: str, headers: dict, body: bytes, last: bool):
    """An end's answer and its first bytes; EndFailed when it failed and another try remains (on
    the last try an error answer is the client's)."""
    try:
        resp = await sv.client.open(url(r, path), to_engine(headers, r.engine_key), body)
    except (FirstByteTimeout, IdleTimeout):
        raise
    except UpstreamError as e:
        if e.bad:
            sv.balancer.mark_bad(r)
        raise EndFailed(end, r, str(e), down=True) from None
    try:
        if (resp.status >= 500 or resp.status in (401, KV_FAILED)) and not last:
            raise EndFailed(end, r, f"answered {resp.status}")
        try:
            return resp, await resp.chunk()
        except Broken as e:
            raise EndFailed(end, r, str(e), down=True) from None
    except BaseException:
        await resp.close()
        raise


async def read_all(resp, limit: int = MAX_ANSWER) -> bytes:
    parts, n = [], 0
    while chunk := await resp.chunk():
        n += len(chunk)
        if n > limit:
            raise BadAnswer(f"the prefill's answer is over {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


async def prefill(sv: Serving, r: Route, path: str, headers: dict, data: dict) -> tuple[dict, object]:
    """vLLM: run the prefill; its kv_transfer_params, checked, and its answer's usage."""
    resp, first = await open_end(sv, PREFILL, r, path, headers, prefill_body(data), False)
    try:
        body = first + await read_all(resp, MAX_ANSWER - len(first))
    except (BadAnswer, UpstreamError) as e:
        raise EndFailed(PREFILL, r, str(e)) from None
    finally:
        await resp.close()
    if 400 <= resp.status < 500:
        ctype = next((v for k, v in resp.headers if k == b"content-type"), b"application/json")
        raise ClientError(resp.status, body, ctype)
    try:
        return prefill_answer(body)
    except BadAnswer as e:
        raise EndFailed(PREFILL, r, str(e)) from None


async def acquire(sv: Serving, ask: Ask, exclude: frozenset[str], place: tuple[int, float]) -> Pick | Response:
    try:
        p, waited = await sv.balancer.acquire(ask.model, exclude, place[0], place[1], ask.prompt)
    except QueueFull:
        return errors.queue_full(ask.model, sv.balancer.depth(ask.model))
    except QueueTimeout:
        return errors.no_replica(ask.model, sv.queue_timeout_s)
    except UnknownModel:
        return errors.unknown_model(ask.model, sv.balancer.table.listed_for(ask.tenant, ask.keyed))
    sv.metrics.queue_wait.labels(ask.model).observe(waited)
    return p


def another_decode(sv: Serving, model: str, p: Pick, exclude: frozenset[str]) -> bool:
    m = sv.balancer.table.models.get(model)
    return m is not None and m.pd is not None and any(
        r.instance not in exclude for r in m.pd.of(p.gen, DECODE))


async def forward_pd(sv: Serving, request: Request, ask: Ask, body: bytes, watch: Disconnect) -> Response:
    """A group's request: its ends chosen, the hand-off spoken, the decode's answer relayed (a
    Relay owning the decode's slot), or the error a client should see."""
    bal, model = sv.balancer, ask.model
    q = request.scope.get("query_string")
    path = request.scope["path"] + (f"?{q.decode('latin-1')}" if q else "")
    headers = request_headers(request.headers.raw)
    data = json.loads(body)
    place = (sv.limits.priority(ask.tenant), time.monotonic())  # a retry keeps its place in the queue
    exclude: frozenset[str] = frozenset()
    for attempt in range(sv.attempts):
        last = attempt + 1 == sv.attempts
        ask.prompt.after = None
        p = await acquire(sv, ask, exclude, place)
        if not isinstance(p, Pick):
            return p
        if p.choice is not None:  # the prefill's choice, as a replica's (route decisions, prefix match)
            sv.metrics.route(model, p.choice)
        try:
            if p.path != DISAGGREGATED:
                return await relay_from(sv, ask, p, p.decode, path, headers, body, watch, last)
            if protocol_of(bal.table.models[model].pd.mode) == SGLANG:
                return await sglang(sv, ask, p, path, headers, data, watch, last)
            return await vllm(sv, ask, p, path, headers, data, watch, last, exclude, place)
        except EndFailed as e:
            sv.metrics.pd_failed(model, e.end)
            log.warning("gateway: %s, request for %s retried", e, model)
            exclude |= {e.route.instance}
        except ClientError as e:
            return Response(e.body, e.status, headers={"content-type": e.ctype.decode("latin-1")})
        except (FirstByteTimeout, IdleTimeout) as e:
            return errors.timeout(model, str(e))
    return errors.unreachable(model, f"{sv.attempts} attempts failed")


async def relay_from(sv: Serving, ask: Ask, p: Pick, d: Route, path: str, headers: dict, body: bytes,
                     watch: Disconnect, last: bool) -> Relay:
    """The decode's answer to ``body``, relayed (the pick's other slots are already released)."""
    sv.metrics.in_flight.labels(ask.model).inc()
    try:
        resp, first = await open_end(sv, DECODE, d, path, headers, body, last)
    except BaseException:
        sv.metrics.in_flight.labels(ask.model).dec()
        sv.balancer.release(d, ask.model)
        raise
    sv.metrics.pd(ask.model, p.path)
    return Relay(sv, ask, d, resp, first, watch)


async def vllm(sv: Serving, ask: Ask, p: Pick, path: str, headers: dict, data: dict, watch: Disconnect, last: bool,
               exclude: frozenset[str], place: tuple[int, float]) -> Response:
    """The prefill, then a decode with its kv_transfer_params: another decode with the same
    params while the one tried is down. The prefill's slot is held until a decode answers (it has
    pulled the KV by then): a prefill drained before a stop is not stopped with KV still to hand off."""
    bal, model = sv.balancer, ask.model
    try:
        params, usage = await prefill(sv, p.prefill, path, headers, data)
    except BaseException:
        bal.release(p, model)
        raise
    # the prefill is the end chosen by cache: its cached prompt tokens correct the index (index_feedback.py)
    bal.answered(p.prefill.instance, ask.prompt, usage, ask.prompt.chars < sv.max_prompt_chars)
    body, d = decode_body(data, params), p.decode
    try:
        while True:
            try:
                return await relay_from(sv, ask, p, d, path, headers, body, watch, last)
            except EndFailed as e:
                if not e.down:  # the decode answered: its pull of this KV failed, start over from another prefill
                    bal.mark_bad(p.prefill)  # its side channel fails: the next requests go to others for a while
                    raise EndFailed(DECODE, p.prefill, f"decode {d.instance} could not take its KV ({e})") from None
                exclude |= {d.instance}
                if not another_decode(sv, model, p, exclude):
                    raise  # counted once, where it is caught
                sv.metrics.pd_failed(model, DECODE)
                ask.prompt.after = p.prefill
                got = await acquire(sv, ask, exclude, place)
                if not isinstance(got, Pick):
                    return got
                d = got.decode
    finally:
        bal.release(p.prefill, model)


async def drain(sv: Serving, r: Route, path: str, headers: dict, body: bytes) -> str | None:
    """SGLang: the prefill's answer, read and dropped; why it failed (None: it did not)."""
    try:
        resp, _ = await open_end(sv, PREFILL, r, path, headers, body, False)
    except (EndFailed, UpstreamError) as e:
        return str(e)
    try:
        while await resp.chunk():
            pass
        return None if resp.status < 400 else f"answered {resp.status}"
    except UpstreamError as e:
        return str(e)
    finally:
        await resp.close()


async def sglang(sv: Serving, ask: Ask, p: Pick, path: str, headers: dict, data: dict, watch: Disconnect,
                 last: bool) -> Response:
    """Both ends at once with the prefill's bootstrap address and a fresh room; the decode's answer
    is relayed. A prefill that fails before the decode's first byte fails the pair."""
    bal, model = sv.balancer, ask.model
    body = bootstrap_body(data, p.prefill)
    if body is None:
        bal.release(p, model)
        raise EndFailed(PREFILL, p.prefill, "no bootstrap port recorded for it")
    pre = asyncio.create_task(drain(sv, p.prefill, path, headers, body))
    pre.add_done_callback(lambda t: bal.release(p.prefill, model))
    draining.add(pre)
    pre.add_done_callback(draining.discard)
    dec = asyncio.create_task(relay_from(sv, ask, p, p.decode, path, headers, body, watch, last))
    try:
        await asyncio.wait({pre, dec}, return_when=asyncio.FIRST_COMPLETED)
        if not dec.done() and pre.result() is not None:  # the prefill failed first: the decode would wait for KV
            dec.cancel()
            raise EndFailed(PREFILL, p.prefill, pre.result())
        return await dec
    except BaseException:
        pre.cancel()
        if not dec.done():
            dec.cancel()  # relay_from releases the decode's slot
        elif not dec.cancelled() and dec.exception() is None:  # a Relay no one will send
            await dec.result().resp.close()
            bal.release(p.decode, model)
            sv.metrics.in_flight.labels(model).dec()
        raise
