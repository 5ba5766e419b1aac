"""Tenants isolated at the gateway, as an outside probe meets it: a real ``gpuflow gateway``
process in front of a stand-in engine process, API keys of several tenants, the official
``openai`` client and raw sockets on loopback.

- a key uses its own tenant's deployments, those shared with its tenant (or ``"*"``), and
  tenant ``default``'s; any other model is a 404 byte for byte as if it did not exist, listing
  only what the key may use; ``/v1/models`` lists the same;
- ``--metrics-key-required``: ``/metrics`` without a valid key is 401, with a tenant's key 403;
- 300 clients that trickle their headers are answered 408 and closed at ``--header-timeout``,
  while others are served meanwhile;
- two request bodies that never finish hold none of their tenant's ``max_concurrent: 2`` slots:
  a third request of the tenant is served, and the two get 408 at ``--body-timeout``."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time

import httpx2 as httpx
import openai
import pytest

from store import keys, records
from tests import gateway_stack as gs
from tests.gateway_stack import procs, sqlite_store  # noqa: F401  (fixtures)

MSG = [{"role": "user", "content": "hello"}]
SPECS = {
    "a-chat": {"tenant": "a"},
    "a-shared": {"tenant": "a", "shared_with": ["b"]},
    "a-all": {"tenant": "a", "shared_with": ["*"]},
    "b-chat": {"tenant": "b"},
    "pub": {},  # tenant default: every key's
}
MAY = {
    "a": ["a-all", "a-chat", "a-shared", "pub"],
    "b": ["a-all", "a-shared", "b-chat", "pub"],
    "c": ["a-all", "pub"],
    "default": ["a-all", "pub"],
}


def client(port: int, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=30)


def not_found(c: openai.OpenAI, model: str) -> httpx.Response:
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model=model, messages=MSG, max_tokens=1)
    return e.value.response


def test_a_key_uses_its_tenants_models_and_no_others(sqlite_store, procs, tmp_path):
    url, schema, engine = sqlite_store
    e = gs.engine("r1")
    procs.append(e)
    for name, spec in SPECS.items():
        gs.deploy(engine, name, **spec)
        gs.running(engine, f"{name}-0", name, e.port)
    g = gs.gateway(url, schema, "--metrics-key-required", log=str(tmp_path / "gw.log"))
    procs.append(g)
    base = f"http://127.0.0.1:{g.port}"
    gs.wait_model(base, "pub", 1)

    # no key exists yet: the gateway is open (loopback) and serves every model, but /metrics
    # asks for a key, which nobody has yet
    anon = client(g.port, "none")
    assert sorted(m.id for m in anon.models.list()) == sorted(SPECS)
    assert anon.chat.completions.create(model="b-chat", messages=MSG, max_tokens=1).choices
    r = httpx.get(f"{base}/metrics", headers={"Authorization": "Bearer none"})
    assert r.status_code == 401 and "none exists yet" in r.json()["error"]["message"]

    k = {t: keys.create(engine, t)[0] for t in MAY}
    gs.wait_for(lambda: httpx.get(f"{base}/v1/models").status_code == 401, 10, "keys required")

    for tenant, may in MAY.items():
        c = client(g.port, k[tenant])
        assert sorted(m.id for m in c.models.list()) == may, tenant
        allowed = ", ".join(may)
        unknown = not_found(c, "zz-none")
        assert json.loads(unknown.content)["error"] == {
            "message": f"The model 'zz-none' does not exist. Models served here: {allowed}.",
            "type": "invalid_request_error", "param": None, "code": "model_not_found"}
        for model in SPECS:
            if model in may:
                assert c.chat.completions.create(model=model, messages=MSG, max_tokens=1).choices, (tenant, model)
                continue
            r = not_found(c, model)  # the same answer as a name nothing has
            assert r.content == unknown.content.replace(b"zz-none", model.encode()), (tenant, model)
            assert sorted(r.headers.keys()) == sorted(unknown.headers.keys())
            assert r.headers["content-type"] == unknown.headers["content-type"]

    # B's key on A's model, then A's model deleted: the very same bytes
    before = not_found(client(g.port, k["b"]), "a-chat")
    records.save_deployment(engine, "a-chat", {"name": "a-chat", "backend": "custom", "run_command": "x",
                                               **SPECS["a-chat"]}, 1, state="deleted")
    gs.wait_for(lambda: "a-chat" not in [m.id for m in client(g.port, k["a"]).models.list()], 10, "a-chat gone")
    after = not_found(client(g.port, k["b"]), "a-chat")
    assert (after.status_code, after.content, dict(after.headers)) == \
        (before.status_code, before.content, dict(before.headers))

    # --metrics-key-required: no key, a bad key, a revoked key: 401 in OpenAI's shape; a tenant's key: 403 (the
    # series name every tenant: issue 40, M6); a metrics or cluster-admin key: 200
    revoked, info = keys.create(engine, "c")
    keys.revoke(engine, info.id)
    for h in ({}, {"Authorization": "Bearer gpuflow-x-y"}, {"Authorization": "Basic abc"},
              {"Authorization": f"Bearer {revoked}"}):
        r = httpx.get(f"{base}/metrics", headers=h)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", h
        assert "gpuflow_gateway_requests_total" not in r.text
    r = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {k['c']}"})
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    assert "gpuflow_gateway_requests_total" not in r.text
    r = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {keys.create(engine, 'c', scope='metrics')[0]}"})
    assert r.status_code == 200 and 'tenant="a"' in r.text
    # a refused model counts as model="" (as an unknown one does)
    assert gs.metric(r.text, "gpuflow_gateway_requests_total", model="", tenant="b", code="404") >= 3


def test_metrics_stay_open_without_the_flag(sqlite_store, procs, tmp_path):
    url, schema, engine = sqlite_store
    keys.create(engine, "a")
    g = gs.gateway(url, schema, log=str(tmp_path / "gw.log"))
    procs.append(g)
    base = f"http://127.0.0.1:{g.port}"
    assert httpx.get(f"{base}/v1/models").status_code == 401
    assert httpx.get(f"{base}/metrics").status_code == 200  # the default, as before: the operator's choice


HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


async def _trickle(port: int, lead: bytes, every: float, give_up: float) -> tuple[float, bytes]:
    """Open a connection, send ``lead``, then one header byte every ``every`` s, never ending the
    headers; (seconds until the gateway closed it, what it sent). ``give_up`` bounds the wait."""
    t0 = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    got = b""
    try:
        writer.write(lead + b"X-Slow: ")
        await writer.drain()

        async def read_all():
            nonlocal got
            while chunk := await reader.read(4096):
                got += chunk

        reading = asyncio.create_task(read_all())
        end = t0 + give_up
        while not reading.done() and time.monotonic() < end:
            try:
                writer.write(b"a")
                await writer.drain()
            except (ConnectionError, OSError):
                break
            await asyncio.wait([reading], timeout=every)
        try:
            await asyncio.wait_for(reading, max(0.0, end - time.monotonic()))
        except (asyncio.TimeoutError, ConnectionError, OSError):
            reading.cancel()
        return time.monotonic() - t0, got
    finally:
        writer.close()


async def test_slow_headers_are_cut_at_the_header_timeout(sqlite_store, procs, tmp_path):
    url, schema, engine = sqlite_store
    e = gs.engine("r1")
    procs.append(e)
    gs.deploy(engine, "chat")
    gs.running(engine, "chat-0", "chat", e.port)
    g = gs.gateway(url, schema, "--header-timeout", "1", log=str(tmp_path / "gw.log"))
    procs.append(g)
    base = f"http://127.0.0.1:{g.port}"
    await asyncio.to_thread(gs.wait_model, base, "chat", 1)
    served = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=30)
    try:

        give_up = 20.0  # the probe saw 60 s; without a header timeout every one of them runs to here
        slow = [asyncio.create_task(_trickle(g.port, HEAD, every=0.25, give_up=give_up)) for _ in range(300)]
        await asyncio.sleep(0.3)
        # meanwhile a well-behaved client is served
        assert (await served.chat.completions.create(model="chat", messages=MSG, max_tokens=1)).choices
        results = await asyncio.gather(*slow)
        took = sorted(t for t, _ in results)
        assert took[-1] < 8.0, f"slowest closed after {took[-1]:.1f} s (header timeout 1 s)"
        assert took[0] >= 0.9  # not before the timeout
        # each is answered 408 in OpenAI's JSON, then closed (a byte of ours that crossed the close
        # may turn it into a reset that the kernel delivers before the answer: nothing read, then)
        answered = [got for _, got in results if got]
        assert len(answered) >= 250, f"{len(answered)} of 300 read the 408"
        for got in answered:
            head, _, body = got.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408"), got[:200]
            assert json.loads(body)["error"]["code"] == "request_timeout"

        # a connection that sends nothing, and one that trickles its second request's headers after
        # a first one was answered, are cut the same way
        t0 = time.monotonic()
        s = socket.create_connection(("127.0.0.1", g.port))
        s.settimeout(give_up)
        assert s.recv(4096).startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 8.0
        s.close()
        body = json.dumps({"model": "chat", "messages": MSG, "max_tokens": 1}).encode()
        named = HEAD.replace(b"Host: 127.0.0.1", f"Host: 127.0.0.1:{g.port}".encode())  # an open gateway checks Host
        first = named + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
        took, got = await _trickle(g.port, first + HEAD, every=0.25, give_up=give_up)
        assert got.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 408" in got and took < 8.0
        assert (await served.chat.completions.create(model="chat", messages=MSG, max_tokens=1)).choices
    finally:
        await served.close()


TENANTS = "tenants:\n  - {name: prod, max_concurrent: 2}\n"


def test_unfinished_bodies_hold_no_tenant_slot(sqlite_store, procs, tmp_path):
    url, schema, engine = sqlite_store
    e = gs.engine("r1")
    procs.append(e)
    gs.deploy(engine, "chat", max_concurrency=16)
    gs.running(engine, "chat-0", "chat", e.port)
    f = tmp_path / "tenants.yaml"
    f.write_text(TENANTS)
    done = subprocess.run([sys.executable, "-m", "gpuflow", "tenants", "apply", str(f), "--database-url", url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    key = keys.create(engine, "prod")[0]
    g = gs.gateway(url, schema, "--body-timeout", "3", log=str(tmp_path / "gw.log"))
    procs.append(g)
    base = f"http://127.0.0.1:{g.port}"
    gs.wait_model(base, "chat", 1, headers={"Authorization": f"Bearer {key}"}, every=0.5)

    body = json.dumps({"model": "chat", "messages": MSG, "max_tokens": 1}).encode()
    stalled = []
    for _ in range(2):  # headers whole, the body's first 10 bytes of len(body), then nothing
        s = socket.create_connection(("127.0.0.1", g.port))
        s.sendall(HEAD + f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body[:10])
        stalled.append((s, time.monotonic()))
    time.sleep(0.5)  # both are with the gateway's app now, waiting for their bodies
    prod = client(g.port, key)
    for _ in range(3):  # prod's max_concurrent is 2: the stalled bodies hold none of it
        assert prod.chat.completions.create(model="chat", messages=MSG, max_tokens=1).choices

    for s, t0 in stalled:
        s.settimeout(20)
        got = b""
        while chunk := s.recv(4096):
            got += chunk
        took = time.monotonic() - t0
        s.close()
        head, _, rest = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408") and b"connection: close" in head.lower(), got[:300]
        err = json.loads(rest)["error"]
        assert err["code"] == "request_timeout" and err["type"] == "invalid_request_error"
        assert 2.5 <= took < 10.0, took

    m = httpx.get(f"{base}/metrics").text
    assert gs.metric(m, "gpuflow_gateway_requests_total", model="", tenant="prod", code="408") == 2
    assert gs.metric(m, "gpuflow_gateway_tenant_rejections_total", tenant="prod") == 0
    # the slots came back: two streams in flight fill them, a third is refused as before
    streams = [prod.chat.completions.create(model="chat", messages=MSG, max_tokens=5000, stream=True)
               for _ in range(2)]
    for st in streams:
        next(iter(st))
    with pytest.raises(openai.RateLimitError):
        prod.chat.completions.create(model="chat", messages=MSG, max_tokens=1)
    for st in streams:
        st.close()
