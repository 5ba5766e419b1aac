"""Tenants at the gateway, as a user meets them: a real ``gpuflow gateway`` process in front of
stand-in engine processes, the tenants file applied with ``gpuflow tenants apply``, API keys of
three tenants, and the official ``openai`` client. A tenant over its ``requests_per_s`` or
``max_concurrent`` gets 429 with ``Retry-After`` while the others are served; requests queued
for a saturated model are served by tenant priority, then arrival."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import time

import httpx2 as httpx
import openai
import pytest

from store import keys
from tests import gateway_stack as gs
from tests.gateway_stack import procs, sqlite_store  # noqa: F401  (fixtures)

MSG = [{"role": "user", "content": "hello"}]
TENANTS = """
tenants:
  - {name: prod, priority: 100, max_concurrent: 2}
  - {name: dev,  priority: 30,  requests_per_s: 0.25}   # burst max(1, 0.25) = 1, then one per 4 s
  - {name: poc,  priority: 10}
  - {name: default, requests_per_s: 0.25}
"""


def apply(url: str, tmp_path, text: str) -> None:
    f = tmp_path / f"tenants-{time.monotonic_ns()}.yaml"
    f.write_text(text)
    done = subprocess.run([sys.executable, "-m", "gpuflow", "tenants", "apply", str(f), "--database-url", url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def client(g: gs.Proc, key: str, cls=openai.OpenAI, **kw):
    return cls(base_url=f"http://127.0.0.1:{g.port}/v1", api_key=key, **{"max_retries": 0, **kw})


def scrape(g: gs.Proc) -> str:
    return httpx.get(f"http://127.0.0.1:{g.port}/metrics").text


def refused(call) -> openai.RateLimitError:
    with pytest.raises(openai.RateLimitError) as e:
        call()
    return e.value


def test_requests_per_s_and_max_concurrent_per_tenant(sqlite_store, procs, tmp_path):
    url, schema, engine = sqlite_store
    e = gs.engine("r1", token_s=0.02)
    procs.append(e)
    gs.deploy(engine, "chat", max_concurrency=16)  # the replica is never the limit here
    gs.running(engine, "chat-0", "chat", e.port)
    apply(url, tmp_path, TENANTS)
    g = gs.gateway(url, schema, log=str(tmp_path / "gw.log"))
    procs.append(g)
    gs.wait_model(f"http://127.0.0.1:{g.port}", "chat", 1, every=0.5)  # /v1/models is not limited

    # No key exists yet: the gateway is open and its requests are tenant default (0.25 a second)
    anon = client(g, "none")
    assert anon.chat.completions.create(model="chat", messages=MSG, max_tokens=1).choices
    err = refused(lambda: anon.chat.completions.create(model="chat", messages=MSG, max_tokens=1))
    assert "'default'" in err.message and 1 <= int(err.response.headers["retry-after"]) <= 4

    k = {t: keys.create(engine, t)[0] for t in ("prod", "dev", "poc")}
    gs.wait_for(lambda: httpx.get(f"http://127.0.0.1:{g.port}/v1/models").status_code == 401, 10, "keys required")
    dev, poc, prod = (client(g, k[t]) for t in ("dev", "poc", "prod"))

    # dev: its one token goes to the first request; the next, well within 4 s, is refused
    t0 = time.monotonic()
    assert dev.chat.completions.create(model="chat", messages=MSG, max_tokens=1).choices
    err = refused(lambda: dev.chat.completions.create(model="chat", messages=MSG, max_tokens=1))
    after = int(err.response.headers["retry-after"])
    assert err.status_code == 429 and err.code == "rate_limit_exceeded" and err.type == "rate_limit_error"
    assert "'dev'" in err.message and "0.25 requests per second" in err.message
    # its token comes back (1 - 0.25 * elapsed) / 0.25 = 4 - elapsed s after the first, rounded up
    assert math.ceil(4 - (time.monotonic() - t0)) <= after <= 4
    # poc, at the same moment, has no limit: ten in a row, all served
    for _ in range(10):
        assert poc.chat.completions.create(model="chat", messages=MSG, max_tokens=1).choices
    # the openai client honours Retry-After: with one retry allowed, dev's request goes through
    # (it has to wait unless the ten above took longer than the 4 s)
    assert client(g, k["dev"], max_retries=1).chat.completions.create(model="chat", messages=MSG,
                                                                       max_tokens=1).choices

    # prod: two streams in flight (each has sent its first chunk), so a third request is refused
    streams = [prod.chat.completions.create(model="chat", messages=MSG, max_tokens=5000, stream=True)
               for _ in range(2)]
    for s in streams:
        next(iter(s))
    err = refused(lambda: prod.chat.completions.create(model="chat", messages=MSG, max_tokens=1))
    assert err.code == "concurrency_limit_exceeded" and "'prod'" in err.message
    assert "2 requests in flight" in err.message and err.response.headers["retry-after"] == "1"
    assert poc.chat.completions.create(model="chat", messages=MSG, max_tokens=1).choices  # poc unaffected
    streams[0].close()  # the client leaves one stream: its slot is free once the gateway sees it end
    gs.wait_for(lambda: _served(prod), 10, "prod's third request once a stream ended", every=0.2)
    streams[1].close()

    # a new file is read within a refresh: poc now gets 0.25 a second too
    apply(url, tmp_path, TENANTS.replace("{name: poc,  priority: 10}", "{name: poc, priority: 10, "
                                                                      "requests_per_s: 0.25}"))
    gs.wait_for(lambda: not _served(poc), 10, "poc limited by the new file", every=0.2)

    m = scrape(g)
    assert gs.metric(m, "gpuflow_gateway_tenant_rejections_total", tenant="default", reason="requests_per_s") == 1
    dev_refused = gs.metric(m, "gpuflow_gateway_tenant_rejections_total", tenant="dev", reason="requests_per_s")
    assert dev_refused in (1, 2)  # 2 when the client's retry had to wait
    assert gs.metric(m, "gpuflow_gateway_tenant_rejections_total", tenant="prod", reason="max_concurrent") >= 1
    assert gs.metric(m, "gpuflow_gateway_tenant_rejections_total", tenant="poc", reason="requests_per_s") >= 1
    assert gs.metric(m, "gpuflow_gateway_requests_total", model="", tenant="dev", code="429") == dev_refused
    assert gs.metric(m, "gpuflow_gateway_requests_total", model="chat", tenant="dev", code="200") == 2


def _served(c: openai.OpenAI) -> bool:
    try:
        return bool(c.chat.completions.create(model="chat", messages=MSG, max_tokens=1).choices)
    except openai.RateLimitError:
        return False


async def test_a_saturated_model_serves_its_queue_by_tenant_priority(sqlite_store, procs, tmp_path):
    url, schema, engine = sqlite_store
    e = gs.engine("r1", token_s=0.05)
    procs.append(e)
    gs.deploy(engine, "busy", max_concurrency=1)  # one replica, one request at a time
    gs.running(engine, "busy-0", "busy", e.port)
    apply(url, tmp_path, TENANTS)
    k = {t: keys.create(engine, t)[0] for t in ("prod", "poc")}
    g = gs.gateway(url, schema, log=str(tmp_path / "gw.log"))
    procs.append(g)
    base = f"http://127.0.0.1:{g.port}"
    gs.wait_model(base, "busy", 1, headers={"Authorization": f"Bearer {k['poc']}"}, every=0.5)
    prod, poc = (client(g, k[t], cls=openai.AsyncOpenAI, timeout=60) for t in ("prod", "poc"))
    try:

        def depth() -> float:
            return gs.metric(scrape(g), "gpuflow_gateway_queue_depth", model="busy")

        # poc holds the only slot with a long stream
        holder = await poc.chat.completions.create(model="busy", messages=MSG, max_tokens=5000, stream=True)
        await holder.__anext__()
        served: list[str] = []

        async def ask(who: str, c) -> None:
            r = await c.chat.completions.create(model="busy", messages=MSG, max_tokens=2)  # 2 * 0.05 s on the replica
            assert r.choices
            served.append(who)

        # three of poc's (priority 10) queue first, then two of prod's (priority 100), each once the
        # one before it is in the queue (so that arrival order is known)
        tasks = []
        for i, (who, c) in enumerate([("poc0", poc), ("poc1", poc), ("poc2", poc), ("prod0", prod), ("prod1", prod)]):
            tasks.append(asyncio.create_task(ask(who, c)))
            await asyncio.to_thread(gs.wait_for, lambda: depth() == i + 1, 10, f"{who} queued", 0.1)
        await holder.close()  # the slot is free: the queue is served one at a time
        await asyncio.gather(*tasks)
        assert served == ["prod0", "prod1", "poc0", "poc1", "poc2"]  # priority first, then arrival
        m = scrape(g)
        assert gs.metric(m, "gpuflow_gateway_requests_total", model="busy", code="200") == 5
        assert gs.metric(m, "gpuflow_gateway_tenant_rejections_total") == 0
    finally:
        await prod.close()
        await poc.close()
