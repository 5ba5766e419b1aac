"""Tenants isolated at the gateway, in tables: which models a key's tenant may use (a
deployment's own tenant, its spec's ``shared_with``, ``"*"``, and tenant ``default``'s
deployments for all; gateway/table.py), the spec's ``shared_with`` field (scheduler/spec.py), the
404 that answers a model the caller may not use exactly as one that does not exist
(gateway/errors.py), admission checked without taking a slot (gateway/tenant_limits.py), and the
gateway's new settings. The same, over real sockets against a real gateway process:
tests/test_gateway_isolation_live.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import pytest
from pydantic import ValidationError

from store.serving import Route
from gateway import errors
from gateway.config import GatewaySettings
from gateway.table import build
from gateway.tenant_limits import Limits, Rule
from scheduler.errors import InvalidInput
from scheduler.spec import ModelSpec


def r(instance: str, deployment: str) -> Route:
    return Route(instance=instance, deployment=deployment, address="127.0.0.1", port=9000)


SPECS = {
    "a-chat": {"tenant": "a"},
    "a-shared": {"tenant": "a", "shared_with": ["b"]},
    "a-all": {"tenant": "a", "shared_with": ["*"]},
    "b-chat": {"tenant": "b", "shared_with": ["c", "d"]},
    "pub": {},  # no tenant: default, shared with all
    "def": {"tenant": "default"},
    "c-bad": {"tenant": "c", "shared_with": "b"},  # malformed in the store: shares nothing
    "d-bad": {"tenant": "d", "shared_with": [7, None]},
}
PUBLIC = ["a-all", "def", "pub"]


@pytest.mark.parametrize("tenant,keyed,want", [
    ("a", True, ["a-all", "a-chat", "a-shared", "def", "pub"]),
    ("b", True, ["a-all", "a-shared", "b-chat", "def", "pub"]),
    ("c", True, ["a-all", "b-chat", "c-bad", "def", "pub"]),
    ("d", True, ["a-all", "b-chat", "d-bad", "def", "pub"]),
    ("e", True, PUBLIC),  # a tenant nothing names: the public ones only
    ("default", True, PUBLIC),  # default's key: its own (shared with all anyway), no other tenant's
    ("anonymous", True, PUBLIC),  # a key whose tenant is called "anonymous" is no open gateway
    ("*", True, PUBLIC),  # "*" in shared_with is no tenant's name
    ("default", False, sorted(SPECS)),  # an open gateway (no key exists; gateway.auth.ANONYMOUS): every model
])
def test_the_models_a_tenant_may_use(tenant, keyed, want):
    t = build([r("a-chat-0", "a-chat"), r("b-chat-0", "b-chat")], SPECS, 4)
    assert t.allowed(tenant, keyed) == want
    assert [n for n in [*SPECS, "zz-none"] if t.may_use(tenant, keyed, n)] == [n for n in SPECS if n in want]


def test_access_is_built_with_the_table_and_does_not_change_its_equality():
    t1 = build([r("a-chat-0", "a-chat")], SPECS, 4)
    t2 = build([r("a-chat-0", "a-chat")], SPECS, 4)
    assert t1 == t2
    assert t1.public == {"a-all", "def", "pub"} and t1.own["a"] == {"a-chat", "a-shared"}  # sets, not per request
    moved = build([r("a-chat-0", "a-chat")], {**SPECS, "a-chat": {"tenant": "a", "shared_with": ["e"]}}, 4)
    assert moved != t1 and moved.may_use("e", True, "a-chat")  # a changed shared_with swaps the table in


def test_access_is_linear_in_the_models():
    """10,000 tenants, each with a model shared with the next, and 1,000 public models: each
    tenant's set holds its own two, not the public thousand."""
    specs = {f"m{i}": {"tenant": f"t{i}", "shared_with": [f"t{i + 1}"]} for i in range(10_000)}
    specs.update({f"p{i}": {} for i in range(1_000)})
    t = build([], specs, 4)
    assert len(t.own) == 10_001 and max(len(ns) for ns in t.own.values()) == 2
    assert t.allowed("t5")[:2] == ["m4", "m5"] and len(t.allowed("t5")) == 1_002


@pytest.mark.parametrize("shared_with,ok", [
    ([], True),
    (["b"], True),
    (["*"], True),
    (["b", "c-2", "default"], True),
    ([f"t{i}" for i in range(256)], True),
    ([f"t{i}" for i in range(257)], False),  # bounded
    (["b", "b"], False),  # no repeats
    (["*", "*"], False),
    (["B"], False),  # the tenants file's names: lower case
    (["-b"], False),
    (["b\n"], False),
    (["b c"], False),
    ([""], False),
    (["x" * 64], False),
    (["**"], False),
    ("b", False),  # a list, not a string
    ([1], False),
])
def test_spec_shared_with(shared_with, ok):
    spec = {"name": "m", "source": {"local_path": "/m"}, "backend": "vllm", "tenant": "a", "shared_with": shared_with}
    if ok:
        assert ModelSpec.model_validate(spec).shared_with == shared_with
    else:
        with pytest.raises(ValidationError, match="shared_with"):
            ModelSpec.model_validate(spec)


def test_shared_with_defaults_to_nobody():
    assert ModelSpec.model_validate({"name": "m", "source": {"local_path": "/m"}, "backend": "vllm"}).shared_with == []


def test_a_forbidden_model_is_answered_as_an_unknown_one():
    t = build([], SPECS, 4)
    allowed = t.allowed("e")
    forbidden, unknown = errors.unknown_model("a-chat", allowed), errors.unknown_model("zz-no", allowed)
    assert forbidden.status_code == unknown.status_code == 404
    assert forbidden.body == unknown.body.replace(b"zz-no", b"a-chat")
    assert dict(forbidden.headers) == {**dict(unknown.headers), "content-length": str(len(forbidden.body))}
    msg = json.loads(forbidden.body)["error"]["message"]
    assert msg == "The model 'a-chat' does not exist. Models served here: a-all, def, pub."


# (rules, what is in flight, tenant) -> what check says; check takes nothing, admit then takes it
@pytest.mark.parametrize("rule,inflight,refused", [
    (Rule(max_concurrent=2), 0, None),
    (Rule(max_concurrent=2), 1, None),
    (Rule(max_concurrent=2), 2, "max_concurrent"),
    (Rule(requests_per_s=1.0), 0, None),
    (Rule(), 50, None),
])
def test_check_takes_nothing(rule, inflight, refused):
    lim = Limits({"p": rule}, now=0.0)
    s = lim.subjects.get("tenant:p")  # None for a tenant without limits: nothing to count
    if s is not None:
        s.active = inflight
    for _ in range(3):  # asked again and again: nothing taken
        got = lim.check("p", 0.0)
        assert (got.reason if got else None) == refused
    assert s is None or s.active == inflight
    if rule.requests_per_s:
        assert s.requests.tokens == 1.0
        assert lim.admit("p", 0.0) is None and lim.check("p", 0.0).reason == "requests_per_s"


@pytest.mark.parametrize("kw", [{"header_timeout_s": 0}, {"body_timeout_s": 0}, {"header_timeout_s": -1}])
def test_timeouts_must_be_positive(kw):
    with pytest.raises(InvalidInput, match=next(iter(kw))):
        GatewaySettings(**kw)


def test_default_timeouts():
    s = GatewaySettings()
    assert (s.header_timeout_s, s.body_timeout_s, s.metrics_key_required) == (10.0, 30.0, False)


def test_header_timeout_reply_is_openai_json():
    raw = errors.header_timeout_bytes(10)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head
    assert f"content-length: {len(body)}".encode() in head
    assert json.loads(body)["error"]["code"] == "request_timeout"


async def _exchange(port: int, parts: list[bytes], gap: float, read_s: float = 10.0) -> tuple[float, bytes]:
    """Send ``parts`` ``gap`` s apart while reading, until the server closes; (seconds from the
    connection to the close, what came back)."""
    t0 = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    got = b""

    async def read_all():
        nonlocal got
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(4096):
                got += chunk

    reading = asyncio.create_task(read_all())
    try:
        for i, p in enumerate(parts):
            if i:
                await asyncio.wait([reading], timeout=gap)
            if reading.done():
                break  # the server closed it
            with contextlib.suppress(ConnectionError):
                writer.write(p)
                await writer.drain()
        await asyncio.wait_for(reading, read_s)
        return time.monotonic() - t0, got
    finally:
        writer.close()


GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize("impl", ["httptools", "h11"])
async def test_header_timeout_on_each_uvicorn_protocol(impl):
    """gateway/protocol.py over uvicorn's two HTTP/1.1 implementations, with real sockets and a
    1 s header timeout (five times what the client that is in time needs: a loaded machine is slow)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route as Path
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from gateway.protocol import with_header_timeout
    from gpuflow.ports import server_port

    async def ok(request):
        return PlainTextResponse("ok")

    base = {"httptools": HttpToolsProtocol, "h11": H11Protocol}[impl]
    port = server_port()
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Path("/", ok)]), host="127.0.0.1", port=port,
                                           http=with_header_timeout(1.0, base), lifespan="off", log_level="warning",
                                           timeout_keep_alive=2))
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.02)
        silent, partial, trickled, in_time, idle_then_slow = await asyncio.gather(
            _exchange(port, [], 0),  # connects, sends nothing
            _exchange(port, [b"GET / HTTP/1.1\r\nHost: x\r\n"], 0),  # headers never end
            _exchange(port, [b"GET / HTTP/1.1\r\n"] + [b"X-A: b\r\n"] * 20, 0.1),  # each byte in time, not the whole
            _exchange(port, [b"GET / HT", b"TP/1.1\r\nHost: x\r\n", b"Connection: close\r\n\r\n"], 0.1),  # 0.2 s: fine
            # a first request answered, idle 1 s (uvicorn's keep-alive, 2 s, covers that), then a slow second one
            _exchange(port, [GET, b"", b"GET / HTTP/1.1\r\n", b"X-A: b\r\n", b"X-A: b\r\n"], 0.5),
        )
        for took, got in (silent, partial, trickled):
            assert got.startswith(b"HTTP/1.1 408") and b'"request_timeout"' in got, got
            assert 0.95 <= took < 4.0, took
        assert in_time[1].startswith(b"HTTP/1.1 200") and b"408" not in in_time[1]
        took, got = idle_then_slow
        assert got.startswith(b"HTTP/1.1 200") and got.count(b"HTTP/1.1 408") == 1, got
        assert 1.5 <= took < 5.0, took  # the clock started at the second request's first byte (1 s in): 408 at 2 s
    finally:
        server.should_exit = True
        await serving
