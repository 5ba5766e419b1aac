"""``gpuflow gateway`` as a user meets it: a real gateway process in front of real stand-in
engine processes, over a real store (rows written by the store's functions), driven by the
official ``openai`` client. No Temporal: the store is all a gateway reads."""

from __future__ import annotations

import asyncio
import time

import httpx2 as httpx
import openai
import pytest

from store import serving
from tests import gateway_stack as gs
from tests.gateway_stack import procs, sqlite_store  # noqa: F401  (fixtures)

MSG = [{"role": "user", "content": "hello"}]


def client(g: gs.Proc, key: str = "none", cls=openai.OpenAI, **kw):
    return cls(base_url=f"http://127.0.0.1:{g.port}/v1", api_key=key, max_retries=0, **kw)


def scrape(g: gs.Proc) -> str:
    return httpx.get(f"http://127.0.0.1:{g.port}/metrics").text


def test_openai_client_plain_streaming_models_and_errors(store, procs, tmp_path):
    url, schema, engine = store
    e = gs.engine("r1")
    procs.append(e)
    gs.deploy(engine, "chat")
    gs.deploy(engine, "idle")  # no replica: listed, requests for it would wait
    gs.running(engine, "chat-0", "chat", e.port)
    g = gs.gateway(url, schema, log=str(tmp_path / "gw.log"))
    procs.append(g)
    c = client(g)
    gs.wait_model(f"http://127.0.0.1:{g.port}", "chat", 1)

    listed = gs.metric(scrape(g), "gpuflow_gateway_requests_total", model="", code="200")  # wait_model's polls
    assert sorted(m.id for m in c.models.list()) == ["chat", "idle"]
    r = c.chat.completions.create(model="chat", messages=MSG, max_tokens=3)
    assert r.choices[0].message.content == "tok0 tok1 tok2 " and r.system_fingerprint == "r1"
    chunks = list(c.chat.completions.create(model="chat", messages=MSG, max_tokens=5, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "tok0 tok1 tok2 tok3 tok4 "
    assert chunks[-1].usage.completion_tokens == 5
    assert c.completions.create(model="chat", prompt="x", max_tokens=2).choices[0].text == "tok0 tok1 "
    assert len(c.embeddings.create(model="chat", input=["a", "bb"]).data) == 2
    with pytest.raises(openai.NotFoundError) as nf:
        c.chat.completions.create(model="nope", messages=MSG)
    assert "'nope'" in str(nf.value) and "chat, idle" in str(nf.value)  # names it, lists what exists
    bad = httpx.post(f"http://127.0.0.1:{g.port}/v1/chat/completions", content=b"{not json")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    assert httpx.post(f"http://127.0.0.1:{g.port}/v1/chat/completions", json={"messages": []}).status_code == 400

    m = scrape(g)
    # 4 answered by chat (chat plain, chat stream, completion, embeddings), each once
    assert gs.metric(m, "gpuflow_gateway_requests_total", model="chat", tenant="default", code="200") == 4
    assert gs.metric(m, "gpuflow_gateway_requests_total", model="", code="404") == 1
    assert gs.metric(m, "gpuflow_gateway_requests_total", model="", code="400") == 2
    assert gs.metric(m, "gpuflow_gateway_requests_total", model="", code="200") == listed + 1  # /v1/models
    # completion tokens from usage: 3 (plain) + 5 (the stream's last chunk) + 2 (completion) = 10
    assert gs.metric(m, "gpuflow_gateway_tokens_total", model="chat", kind="completion") == 10
    assert gs.metric(m, "gpuflow_gateway_time_to_first_token_seconds_count", model="chat") == 1  # one stream
    assert gs.metric(m, "gpuflow_gateway_inter_token_latency_seconds_count", model="chat") == 4  # 5 tokens: 4 gaps
    assert gs.metric(m, "gpuflow_gateway_request_duration_seconds_count", model="chat") == 4
    assert gs.metric(m, "gpuflow_gateway_in_flight", model="chat") == 0


def test_a_stream_the_client_closes_at_its_done_is_served_and_one_cut_short_is_499(sqlite_store, procs, tmp_path):
    # The openai client closes a stream at its [DONE]; an engine may end its response later. The
    # answer was whole: counted 200. A client that leaves before the [DONE] is counted 499.
    url, schema, engine = sqlite_store
    e = gs.engine("slow-end", mode="linger")  # the replica keeps each stream open 2 s after [DONE]
    procs.append(e)
    gs.deploy(engine, "chat")
    gs.running(engine, "chat-0", "chat", e.port)
    g = gs.gateway(url, schema, log=str(tmp_path / "gw.log"))
    procs.append(g)
    gs.wait_model(f"http://127.0.0.1:{g.port}", "chat", 1)
    c = client(g)
    for _ in range(3):  # the openai client reads to [DONE], then closes the connection
        chunks = list(c.chat.completions.create(model="chat", messages=MSG, max_tokens=3, stream=True))
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "tok0 tok1 tok2 "
    with httpx.stream("POST", f"http://127.0.0.1:{g.port}/v1/chat/completions",
                      json={"model": "chat", "messages": MSG, "max_tokens": 50, "stream": True}) as r:
        next(r.iter_lines())  # the first event only, then away
    gs.wait_for(lambda: gs.metric(scrape(g), "gpuflow_gateway_in_flight", model="chat") == 0, 10, "every stream ended")
    m = scrape(g)
    assert gs.metric(m, "gpuflow_gateway_requests_total", model="chat", code="200") == 3
    assert gs.metric(m, "gpuflow_gateway_requests_total", model="chat", code="499") == 1


async def test_two_replicas_share_the_load_and_a_killed_one_loses_no_request(sqlite_store, procs, tmp_path):
    url, schema, engine = sqlite_store
    a, b = gs.engine("ra", token_s=0.01), gs.engine("rb", token_s=0.01)
    procs += [a, b]
    gs.deploy(engine, "chat", max_concurrency=8)
    gs.running(engine, "chat-0", "chat", a.port)
    gs.running(engine, "chat-1", "chat", b.port)
    g = gs.gateway(url, schema, log=str(tmp_path / "gw.log"))
    procs.append(g)
    gs.wait_model(f"http://127.0.0.1:{g.port}", "chat", 2)
    c = client(g, cls=openai.AsyncOpenAI, timeout=60)
    try:
        served: list[str] = []

        async def one(i: int):
            r = await c.chat.completions.create(model="chat", messages=MSG, max_tokens=5)
            served.append(r.system_fingerprint)

        async def worker(i: int, n: int):
            for j in range(n):
                await one(i * n + j)

        load = asyncio.gather(*(worker(i, 25) for i in range(12)))  # 300 requests, 12 at a time
        while len(served) < 60:
            await asyncio.sleep(0.01)
        before = set(served)
        a.kill()  # SIGKILL in the middle of the load: its in-flight requests die with it
        await load  # raises if a single request failed
        assert len(served) == 300
        assert before == {"ra", "rb"}  # both replicas took requests while both were up
        assert served[-50:] == ["rb"] * 50  # after the kill, only the survivor answers
        m = scrape(g)
        assert gs.metric(m, "gpuflow_gateway_requests_total", model="chat", code="200") == 300
        assert gs.metric(m, "gpuflow_gateway_requests_total", model="chat") == 300  # and nothing else
    finally:
        await c.close()


def test_keys_none_bad_revoked_get_401_and_a_good_one_counts_under_its_tenant(sqlite_store, procs, tmp_path):
    import subprocess
    import sys

    url, schema, engine = sqlite_store
    cli = [sys.executable, "-m", "gpuflow", "keys"]

    def keys(*args):
        return subprocess.run(cli + list(args) + ["--database-url", url], capture_output=True, text=True, timeout=60)

    # an open gateway on a non-loopback address refuses to start
    port = gs.server_port()
    refused = subprocess.run([sys.executable, "-m", "gpuflow", "gateway", "--database-url", url,
                              "--listen", f"0.0.0.0:{port}"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--allow-anonymous" in refused.stderr

    from scheduler.tenancy.config import TenantsFile
    from store import tenants

    tenants.apply(engine, TenantsFile.model_validate({"tenants": [{"name": "team-a"}, {"name": "team-b"}]}))
    made = keys("create", "--tenant", "team-a", "--name", "ci")
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip().splitlines()[-1]
    other = keys("create", "--tenant", "team-b").stdout.strip().splitlines()[-1]
    listed = keys("list")
    assert "team-a" in listed.stdout and key.split("-", 2)[2] not in listed.stdout  # the secret is never shown
    e = gs.engine("r1")
    procs.append(e)
    gs.deploy(engine, "chat")
    gs.running(engine, "chat-0", "chat", e.port)
    g = gs.gateway(url, schema, log=str(tmp_path / "gw.log"))
    procs.append(g)
    gs.wait_model(f"http://127.0.0.1:{g.port}", "chat", 1, headers={"Authorization": f"Bearer {key}"})

    base = f"http://127.0.0.1:{g.port}/v1/chat/completions"
    assert httpx.post(base, json={"model": "chat", "messages": MSG}).status_code == 401  # no key
    with pytest.raises(openai.AuthenticationError):
        client(g, "gpuflow-000000000000-" + "x" * 43).chat.completions.create(model="chat", messages=MSG)
    for _ in range(3):
        assert client(g, key).chat.completions.create(model="chat", messages=MSG).choices
    client(g, other).chat.completions.create(model="chat", messages=MSG)
    revoked = keys("revoke", key.split("-", 2)[1])
    assert revoked.returncode == 0 and "revoked" in revoked.stdout
    t = time.monotonic()
    served = []  # the polls answered before the revocation reached the gateway: they count under team-a

    def refused() -> bool:
        code = httpx.post(base, json={"model": "chat", "messages": MSG},
                          headers={"Authorization": f"Bearer {key}"}).status_code
        served.append(code == 200)
        return code == 401
    gs.wait_for(refused, 10, "revocation")
    assert time.monotonic() - t < 3  # effective within about two seconds
    with pytest.raises(openai.AuthenticationError):
        client(g, key).chat.completions.create(model="chat", messages=MSG)
    m = scrape(g)
    assert gs.metric(m, "gpuflow_gateway_requests_total", model="chat", tenant="team-a", code="200") == 3 + sum(served)
    assert gs.metric(m, "gpuflow_gateway_requests_total", model="chat", tenant="team-b", code="200") == 1
    assert gs.metric(m, "gpuflow_gateway_requests_total", code="401") >= 4  # none, bad, revoked (+ polls)


async def test_waiting_for_a_replica_then_503_and_a_full_queue_429(sqlite_store, procs, tmp_path):
    url, schema, engine = sqlite_store
    gs.deploy(engine, "cold")  # no replica at all
    gs.deploy(engine, "busy", max_concurrency=1)
    hang = gs.engine("stuck", mode="hang")
    procs.append(hang)
    gs.running(engine, "busy-0", "busy", hang.port)
    g = gs.gateway(url, schema, "--queue-timeout", "2", "--max-queue", "2", log=str(tmp_path / "gw.log"))
    procs.append(g)
    base = f"http://127.0.0.1:{g.port}"
    gs.wait_model(base, "busy", 1)
    async with httpx.AsyncClient(timeout=30) as h:
        t = time.monotonic()
        r = await h.post(f"{base}/v1/chat/completions", json={"model": "cold", "messages": MSG})
        waited = time.monotonic() - t
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "no_replica_available" and 1.9 < waited < 10

        # scale from zero: a request waiting for "cold" is answered once a replica is RUNNING
        e = gs.engine("warm")
        procs.append(e)
        waiting = asyncio.create_task(h.post(f"{base}/v1/chat/completions", json={"model": "cold", "messages": MSG}))
        await asyncio.sleep(0.3)
        gs.running(engine, "cold-0", "cold", e.port)
        assert (await waiting).status_code == 200

        # busy: one request holds the only slot (the replica never answers), two wait, the next is refused
        held = [asyncio.create_task(h.post(f"{base}/v1/chat/completions", json={"model": "busy", "messages": MSG}))
                for _ in range(3)]
        await asyncio.sleep(0.5)
        full = await h.post(f"{base}/v1/chat/completions", json={"model": "busy", "messages": MSG})
        assert full.status_code == 429 and full.json()["error"]["type"] == "rate_limit_error"
        assert "retry-after" in full.headers
        assert gs.metric(scrape(g), "gpuflow_gateway_queue_depth", model="busy") == 2
        # what a drain reads: this gateway's report of the one request in flight on busy-0
        gs.wait_for(lambda: serving.in_flight(engine, "busy-0") == 1, 5, "busy-0's in-flight report")
        for x in held:
            x.cancel()  # the clients leave: their requests stop waiting, the held slot is freed
        await asyncio.gather(*held, return_exceptions=True)
        gs.wait_for(lambda: gs.metric(scrape(g), "gpuflow_gateway_requests_total", model="busy", code="499") == 3,
                    5, "three abandoned requests")
        gs.wait_for(lambda: serving.in_flight(engine, "busy-0") == 0, 5, "busy-0 idle again")
        assert gs.metric(scrape(g), "gpuflow_gateway_queue_depth", model="busy") == 0
    m = scrape(g)
    assert gs.metric(m, "gpuflow_gateway_requests_total", model="cold", code="503") == 1
    assert gs.metric(m, "gpuflow_gateway_requests_total", model="busy", code="429") == 1
    assert gs.metric(m, "gpuflow_gateway_queue_wait_seconds_count", model="cold") == 1  # the one that got a replica
    assert [x.url for x in serving.live_gateways(engine)] == [f"http://127.0.0.1:{g.port}/v1"]
    g.stop()  # a clean shutdown takes its rows with it
    assert serving.live_gateways(engine) == [] and serving.in_flight(engine, "busy-0") == 0


def test_a_replica_that_never_answers_gives_504_within_the_timeout(sqlite_store, procs, tmp_path):
    url, schema, engine = sqlite_store
    hang = gs.engine("stuck", mode="hang")
    procs.append(hang)
    gs.deploy(engine, "slow")
    gs.running(engine, "slow-0", "slow", hang.port)
    g = gs.gateway(url, schema, "--first-byte-timeout", "1", log=str(tmp_path / "gw.log"))
    procs.append(g)
    gs.wait_model(f"http://127.0.0.1:{g.port}", "slow", 1)
    t = time.monotonic()
    with pytest.raises(openai.APIStatusError) as e:
        client(g, timeout=30).chat.completions.create(model="slow", messages=MSG)
    assert e.value.status_code == 504 and "1 s" in str(e.value)
    assert time.monotonic() - t < 5


def test_a_replica_that_never_accepts_the_connection_gives_504(sqlite_store, procs, tmp_path):
    import socket

    url, schema, engine = sqlite_store
    port = gs.server_port()
    with socket.socket() as full:  # a backlog of 0 that nobody accepts from: further SYNs are dropped
        full.bind(("127.0.0.1", port))
        full.listen(0)
        queued = []
        while len(queued) < 8:  # fill the accept queue until a connect times out
            try:
                queued.append(socket.create_connection(("127.0.0.1", port), timeout=0.5))
            except TimeoutError:
                break
        assert len(queued) < 8
        gs.deploy(engine, "deaf")
        gs.running(engine, "deaf-0", "deaf", port)
        g = gs.gateway(url, schema, "--connect-timeout", "1", log=str(tmp_path / "gw.log"))
        procs.append(g)
        gs.wait_model(f"http://127.0.0.1:{g.port}", "deaf", 1)
        with pytest.raises(openai.APIStatusError) as e:
            client(g, timeout=30).chat.completions.create(model="deaf", messages=MSG)
        assert e.value.status_code == 504 and "connect timeout" in str(e.value)
        for q in queued:
            q.close()


def test_a_failing_replica_is_skipped_and_a_lone_one_passes_its_error_through(sqlite_store, procs, tmp_path):
    url, schema, engine = sqlite_store
    bad, good = gs.engine("bad", mode="error"), gs.engine("good")
    procs += [bad, good]
    gs.deploy(engine, "chat")
    gs.deploy(engine, "lone")
    gs.running(engine, "chat-0", "chat", bad.port)
    gs.running(engine, "chat-1", "chat", good.port)
    gs.running(engine, "lone-0", "lone", bad.port)
    g = gs.gateway(url, schema, "--max-body", "4096", log=str(tmp_path / "gw.log"))
    procs.append(g)
    gs.wait_model(f"http://127.0.0.1:{g.port}", "chat", 2)
    c = client(g)
    assert {c.chat.completions.create(model="chat", messages=MSG).system_fingerprint for _ in range(20)} == {"good"}
    with pytest.raises(openai.InternalServerError) as e:
        c.chat.completions.create(model="lone", messages=MSG)
    assert "bad is broken" in str(e.value)  # the replica's own error, unchanged
    big = httpx.post(f"http://127.0.0.1:{g.port}/v1/chat/completions",
                     json={"model": "chat", "messages": [{"role": "user", "content": "x" * 5000}]})
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"


async def test_in_process_gateway_serves_until_told_to_stop(sqlite_store, procs):
    from gateway.app import serve
    from gateway.config import GatewaySettings

    url, _, engine = sqlite_store
    e = gs.engine("r1")
    procs.append(e)
    gs.deploy(engine, "chat")
    gs.running(engine, "chat-0", "chat", e.port)
    settings = GatewaySettings(port=gs.server_port())
    up, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve(engine, settings, ready=up.set, stop=stop))
    await asyncio.wait_for(up.wait(), 30)
    # closed here: the session's tests share one event loop (see tests/test_autoscale_live.py Load)
    async with openai.AsyncOpenAI(base_url=settings.url, api_key="none", max_retries=0) as c:
        assert (await c.chat.completions.create(model="chat", messages=MSG)).system_fingerprint == "r1"
    async with httpx.AsyncClient() as h:
        assert (await h.get(f"http://127.0.0.1:{settings.port}/healthz")).json()["status"] == "ok"
    stop.set()
    await asyncio.wait_for(task, 30)
    assert serving.live_gateways(engine) == []


def test_a_replica_dying_mid_stream_ends_the_stream_with_an_error(sqlite_store, procs, tmp_path):
    url, schema, engine = sqlite_store
    a, b = gs.engine("ra", token_s=0.2), gs.engine("rb", token_s=0.2)
    procs += [a, b]
    gs.deploy(engine, "chat")
    gs.running(engine, "chat-0", "chat", a.port)
    gs.running(engine, "chat-1", "chat", b.port)
    g = gs.gateway(url, schema, log=str(tmp_path / "gw.log"))
    procs.append(g)
    gs.wait_model(f"http://127.0.0.1:{g.port}", "chat", 2)
    got = []
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        for ch in client(g, timeout=30).chat.completions.create(model="chat", messages=MSG, max_tokens=50,
                                                                stream=True):
            got.append(ch)
            if len(got) == 3:  # bytes have reached the client: the replica's death is not hidden
                {"ra": a, "rb": b}[ch.system_fingerprint].kill()
    assert 3 <= len(got) < 50
    # the survivor still answers, and the broken stream was counted once
    assert client(g).chat.completions.create(model="chat", messages=MSG).choices
    m = scrape(g)
    assert gs.metric(m, "gpuflow_gateway_requests_total", model="chat", code="502") == 1  # counted as broken
    assert gs.metric(m, "gpuflow_gateway_requests_total", model="chat", code="200") == 1


def test_a_state_change_reaches_the_gateway_within_two_seconds(sqlite_store, procs, tmp_path):
    url, schema, engine = sqlite_store
    a, b = gs.engine("ra"), gs.engine("rb")
    procs += [a, b]
    gs.deploy(engine, "chat")
    gs.running(engine, "chat-0", "chat", a.port)
    g = gs.gateway(url, schema, log=str(tmp_path / "gw.log"))
    procs.append(g)
    base = f"http://127.0.0.1:{g.port}"
    gs.wait_model(base, "chat", 1)
    c = client(g)
    for change, replicas, serving_now in ((lambda: gs.running(engine, "chat-1", "chat", b.port), 2, {"ra", "rb"}),
                                          (lambda: gs.running(engine, "chat-0", "chat", a.port, "stopping"), 1, {"rb"}),
                                          (lambda: gs.running(engine, "chat-1", "chat", b.port, "error"), 0, set())):
        t = time.monotonic()
        change()
        gs.wait_model(base, "chat", replicas, timeout=10, every=0.02)
        assert time.monotonic() - t < 2.0  # polled every 0.5 s
        if serving_now:
            assert {c.chat.completions.create(model="chat", messages=MSG).system_fingerprint
                    for _ in range(30)} == serving_now
