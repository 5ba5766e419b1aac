"""The gateway's ASGI app (Starlette, served by uvicorn). ``build(engine, settings)`` gives the
app, ready to mount or serve; ``serve(engine, settings)`` runs it until SIGINT/SIGTERM;
``check_start`` refuses an open gateway on a non-loopback address. What the gateway does not own
comes in through ``build``: ``wake``, the autoscaler's wake (gateway/wake.py), and ``extra``, more
routes to serve beside the API (the web console); ``gpuflow gateway`` hands both."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.engine import Engine
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as Path

from store import keys
from gateway import errors
from gateway.auth import Auth, NoKey, NotAllowed
from gateway.balance import Balancer, Prompt
from gateway.cache_aware import CACHE_AWARE, Knobs
from gateway.cache_watch import CacheWatch
from gateway.config import GatewaySettings, is_loopback
from gateway.host_check import HostGuard
from gateway.metrics import Metrics
from gateway.pd_protocol import without_handoff
from gateway.prefix_index import PrefixIndex, block_hashes, prompt_text
from gateway.prompt_tokens import tokenize
from gateway.protocol import with_header_timeout
from gateway.refresh import Refresher
from gateway.pd_route import forward_pd
from gateway.relay import Ask, Disconnect, Relay, Serving, TooLarge, forward, read_body
from gateway.stream_usage import ask_usage
from gateway.tenant_limits import Limits, key_rule
from gateway.upstream import make_client
from gateway.usage_counter import UsageCounter
from gateway.wake import Wake, Waker
from scheduler.errors import InvalidInput

STALE_S = 30.0  # /healthz fails when the routing table could not be read for this long
DEBUG = "x-gpuflow-debug"  # a request carrying "route" here gets the routing decision back, in relay.ROUTE:
#                             "replica=NAME; matched=M/N blocks; load=L/LIMIT; reason=R" (gateway/cache_aware.py)


class BodyTimeout(Exception):
    pass


class Gateway:
    def __init__(self, engine: Engine, settings: GatewaySettings, wake: Wake | None = None):
        s = self.settings = settings
        self.engine = engine
        self.balancer = Balancer(s.queue_timeout_s, s.max_queue, s.bad_s, routing=s.routing,
                                 index=PrefixIndex(s.prefix_cache_blocks),
                                 knobs=Knobs(slack_min=s.route_slack, cost=s.route_cost),
                                 block_chars=s.prefix_block_chars)
        self.auth = Auth(engine, s.key_cache_s)
        self.metrics = Metrics()
        self.usage = UsageCounter()  # requests and tokens per key, tenant and model (refresh.py flushes them)
        self.limits = Limits(me=s.gateway_id)  # tenants' and keys' limits, this gateway's share (refresh.py)
        self.refresher = Refresher(self)
        self.caches = CacheWatch(self.balancer, s.prefix_block_chars, s.tokenizer_roots, s.kv_events,
                                 lambda result: self.metrics.kv_events.labels(result).inc())
        self.waker = Waker(wake, lambda m: self.metrics.queue_depth.labels(m).set(self.balancer.depth(m)))
        self.client = None
        self.serving: Serving | None = None  # what the request path is handed, once the client is open (lifespan)

    async def relay(self, request: Request) -> Response:
        t0 = time.perf_counter()
        model, tenant, key_id, admitted, handed = "", "", "", False, False
        try:
            tenant, keyed, key_id, key = await self.auth.whose(request.headers.get("authorization"))
            rule = key_rule(key)
            # the body arrives whole (bounded in size and time) before the limits count the request:
            # a client that never finishes its body holds no max_concurrent slot
            refused = self.limits.check(tenant, time.monotonic(), key_id, rule)
            if refused is None:
                body = await self._body(request)
                refused = self.limits.admit(tenant, time.monotonic(), key_id, rule)
            if refused is not None:
                self.metrics.tenant_rejections.labels(refused.tenant, refused.reason).inc()
                r = errors.tenant_limit(refused.message, refused.reason, refused.retry_after_s, refused.scope)
            else:
                admitted = True
                r, model = await self._route(request, t0, tenant, keyed, key_id, body)
                handed = isinstance(r, Relay)  # the tenant's slot ends with the relayed answer
        except NoKey as e:
            r = errors.unauthorized(str(e))
        except NotAllowed as e:
            r = errors.error(403, str(e), "permission_error", "insufficient_scope")
        except TooLarge:
            r = errors.too_large(self.settings.max_body)
        except BodyTimeout:
            r = errors.body_timeout(self.settings.body_timeout_s)
        except ClientDisconnect:
            r = errors.error(499, "The client closed the request.", "client_closed", "client_closed")
        finally:
            if admitted and not handed:
                self.limits.done(tenant, key_id)
        if not isinstance(r, Relay):  # a relayed answer counts itself when it ends
            self.metrics.requests.labels(model, tenant, str(r.status_code)).inc()
            self.metrics.duration.labels(model).observe(time.perf_counter() - t0)
        return r

    async def _body(self, request: Request) -> bytes:
        """The whole body: TooLarge over ``max_body``, BodyTimeout when it has not all arrived
        within ``body_timeout_s``."""
        try:
            async with asyncio.timeout(self.settings.body_timeout_s):
                return await read_body(request, self.settings.max_body)
        except TimeoutError:
            raise BodyTimeout from None

    async def _route(self, request: Request, t0: float, tenant: str, keyed: bool, key_id: str,
                     body: bytes) -> tuple[Response, str]:
        """The answer to an admitted request, and the model it named ("" when none it could).
        A model the caller's tenant may not use is answered exactly as one that does not exist."""
        try:
            data = json.loads(body)
        except (ValueError, RecursionError) as e:
            return errors.bad_request(f"The request body is not valid JSON: {e}", "invalid_json"), ""
        data, body = without_handoff(data, body)  # the KV hand-off's fields are the gateway's to write
        name = data.get("model") if isinstance(data, dict) else None
        if not isinstance(name, str) or not name:
            return errors.bad_request("The request needs a 'model' naming a deployment.", "missing_model"), ""
        table = self.balancer.table
        if not table.may_use(tenant, keyed, name):
            return errors.unknown_model(name, table.listed_for(tenant, keyed)), ""
        if not table.models[name].openai:
            return errors.bad_request(f"Deployment '{name}' serves no OpenAI API (its spec says api: none): the "
                                      "gateway cannot relay requests to it.", "not_an_openai_model"), name
        cold = not table.models[name].size  # scaled to zero: start one now
        if cold:
            self.waker.poke(name)
        prompt = await self._prompt(request, name, data)
        body, hide = ask_usage(request.scope["path"], data, body)  # a stream's tokens (gateway/stream_usage.py)
        ask = Ask(name, tenant, keyed, key_id, t0, data.get("stream") is True, prompt, cold=cold,
                  show_route="route" in request.headers.get(DEBUG, "").lower(), hide_usage=hide,
                  asked=(data, request.scope["path"].endswith("/chat/completions"), prompt.tokens))
        return await self._forward(request, ask, body), name

    async def _prompt(self, request: Request, model: str, data) -> Prompt:
        """The request's prompt blocks, hashed only for a deployment routed by cache (an
        embedding has no prefix cache: nothing to hash); and its token ids, in a thread, when a
        replica of it publishes KV events and its tokenizer is loaded (gateway/cache_watch.py)."""
        s = self.settings
        path = request.scope["path"]
        m = self.balancer.table.models.get(model)
        group = m is not None and m.pd is not None  # a group's skip threshold needs the prompt's length
        if (self.balancer.routing_of(model) != CACHE_AWARE and not group) or path.endswith("/embeddings"):
            return Prompt()
        text = prompt_text(data, s.max_prompt_chars)
        p = Prompt(block_hashes(text, s.prefix_block_chars), chars=len(text))
        tok = self.caches.tokenizers.get(m.tokenizer) if m is not None and p.blocks else None
        if tok is not None and any(r.instance in self.balancer.tokens.live for r in m.replicas):
            p.tokens = await asyncio.to_thread(tokenize, tok, data, path.endswith("/chat/completions"),
                                               s.max_prompt_chars)
        return p

    async def _forward(self, request: Request, ask: Ask, body: bytes) -> Response:
        watch = Disconnect(request.receive)
        try:
            m = self.balancer.table.models.get(ask.model)
            r = await (forward_pd if m is not None and m.pd is not None else forward)(self.serving, request, ask,
                                                                                     body, watch)
        except asyncio.CancelledError:
            if not watch.fired:
                raise
            asyncio.current_task().uncancel()  # the client left while its request waited
            r = errors.error(499, "The client closed the request.", "client_closed", "client_closed")
        if not isinstance(r, Relay):
            watch.stop()
        return r

    async def models(self, request: Request) -> Response:
        """The models the caller's tenant may use whose engines serve the OpenAI API (gateway/table.py
        ``listed_for``), no others."""
        try:
            tenant, keyed = await self.auth.caller(request.headers.get("authorization"))
        except NoKey as e:
            self.metrics.requests.labels("", "", "401").inc()
            return errors.unauthorized(str(e))
        except NotAllowed as e:
            self.metrics.requests.labels("", "", "403").inc()
            return errors.error(403, str(e), "permission_error", "insufficient_scope")
        t = self.balancer.table
        self.metrics.requests.labels("", tenant, "200").inc()
        return JSONResponse({"object": "list", "data": [
            {"id": n, "object": "model", "created": 0, "owned_by": "gpuflow", "replicas": t.models[n].size}
            for n in t.listed_for(tenant, keyed)]})

    async def healthz(self, request: Request) -> Response:
        at = self.refresher.loaded_at
        age = None if at is None else time.monotonic() - at
        ok = age is not None and age < STALE_S
        return JSONResponse({"status": "ok" if ok else "stale", "models": len(self.balancer.table.models),
                             "table_age_s": None if age is None else round(age, 3),
                             "gateway": self.settings.gateway_id}, status_code=200 if ok else 503)

    async def prometheus(self, request: Request) -> Response:
        """The gateway's metrics (they name tenants and models); with ``metrics_key_required``,
        only for a cluster-admin or metrics key (gateway/auth.py): on an open gateway for nobody."""
        if self.settings.metrics_key_required:
            try:
                await self.auth.metrics_reader(request.headers.get("authorization"))
            except NoKey as e:
                return errors.unauthorized(str(e))
            except NotAllowed as e:
                return errors.error(403, str(e), "permission_error", "insufficient_scope")
        self.metrics.index_sizes(self.balancer.index_rows())
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        s = self.settings
        self.client = make_client(s.http_client, s.connect_timeout_s, s.first_byte_timeout_s, s.idle_timeout_s)
        self.serving = Serving(self.balancer, self.client, self.limits, self.usage, self.metrics, self.caches.tokenizers,
                               s.attempts, s.queue_timeout_s, s.max_prompt_chars)
        await self.refresher.once()
        task = asyncio.create_task(self.refresher.run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await self.usage.settle()  # the streams still being counted
            await self.usage.flush(self.engine, s.gateway_id, time.time(), force=True)
            await asyncio.to_thread(self.refresher.forget)
            await self.caches.close()
            await self.client.close()


def build(engine: Engine, settings: GatewaySettings | None = None, extra: tuple = (),
          wake: Wake | None = None) -> Starlette:
    """The gateway's app; ``app.state.gateway`` is its Gateway (balancer, metrics, settings).
    ``extra``: functions of the Gateway giving more routes to serve beside the API (the web
    console's mount: ``gpuflow gateway`` passes it; the serving path never imports it). ``wake``:
    what wakes a deployment's autoscaler (gateway/wake.py; None: never woken)."""
    gw = Gateway(engine, settings or GatewaySettings(), wake)
    post = ["POST"]
    app = Starlette(routes=[
        Path("/v1/chat/completions", gw.relay, methods=post),
        Path("/v1/completions", gw.relay, methods=post),
        Path("/v1/embeddings", gw.relay, methods=post),
        Path("/v1/models", gw.models, methods=["GET"]),
        Path("/metrics", gw.prometheus, methods=["GET"]),
        Path("/healthz", gw.healthz, methods=["GET"]),
        *(m(gw) for m in extra),
    ], lifespan=gw.lifespan)
    app.add_middleware(HostGuard, gw=gw)  # the Host a request names (gateway/host_check.py)
    app.state.gateway = gw
    return app


def check_start(engine: Engine, settings: GatewaySettings) -> None:
    """An open gateway (no key yet) listens on loopback only, unless told --allow-anonymous."""
    if not is_loopback(settings.host) and not settings.allow_anonymous and not keys.any_key(engine):
        raise InvalidInput(f"gateway on {settings.host}: no API key exists, so anyone who reaches it could use every "
                           "model; create one with 'gpuflow keys create --tenant T', or pass --allow-anonymous")


def uvicorn_config(app: Starlette, settings: GatewaySettings):
    import importlib.util

    import uvicorn

    has = importlib.util.find_spec
    return uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning", access_log=False,
                          loop="uvloop" if has("uvloop") else "asyncio",
                          http=with_header_timeout(settings.header_timeout_s),  # httptools (else h11), headers bounded
                          timeout_graceful_shutdown=5, proxy_headers=False, server_header=False, date_header=False)


def run(engine: Engine, settings: GatewaySettings, extra: tuple = (), wake: Wake | None = None) -> None:
    """Run a gateway in this thread, on its own event loop (uvloop where installed), until
    SIGINT/SIGTERM."""
    import uvicorn

    check_start(engine, settings)
    print(f"gpuflow gateway {settings.gateway_id}: OpenAI API on {settings.url}", flush=True)
    uvicorn.Server(uvicorn_config(build(engine, settings, extra, wake), settings)).run()


async def serve(engine: Engine, settings: GatewaySettings, ready=None, stop: asyncio.Event | None = None) -> None:
    """Run a gateway on the running event loop (for embedding it in another program, e.g. the dev
    stack) until ``stop`` is set, or SIGINT/SIGTERM; ``ready()`` is called once it listens."""
    import uvicorn

    await asyncio.to_thread(check_start, engine, settings)
    server = uvicorn.Server(uvicorn_config(build(engine, settings), settings))

    async def watch():
        while not server.started and not server.should_exit:
            await asyncio.sleep(0.05)
        if ready is not None and server.started:
            ready()
        if stop is not None:
            await stop.wait()
            server.should_exit = True
    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        await server.serve()
    finally:
        watcher.cancel()
