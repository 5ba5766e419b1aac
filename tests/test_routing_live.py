"""Cache-aware routing as a user meets it: one real ``gpuflow gateway`` process in front of
stand-in engines with a prefix cache (tests/standin_cache_engine.py), over a real store, driven
by the official ``openai`` client. One stack for the module (processes take a second each to
start): affinity holds, the imbalance guard fires, a drained replica leaves the index, and
retries still work."""

from __future__ import annotations

import asyncio

import httpx2 as httpx
import openai
import pytest

from store import db
from tests import gateway_stack as gs

DEBUG = {"x-gpuflow-debug": "route"}


def system(who: str) -> dict:
    """A customer's long system prompt: 2,000 characters, 15 whole blocks of 128."""
    return {"role": "system", "content": (f"You are {who}'s assistant. " * 100)[:2000]}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("routing")
    url = db.sqlite_url(str(tmp / "gpuflow.db"))
    store = db.make_engine(url)
    db.init_db(store)
    procs: list[gs.Proc] = []
    try:
        engines = {n: gs.cache_engine(n, prefill_block_s=0.002, token_s=0.02) for n in ("ra", "rb", "rc")}
        procs += engines.values()
        bad = gs.engine("bad", mode="error")
        procs.append(bad)
        gs.deploy(store, "chat", max_concurrency=8)
        for i, e in enumerate(engines.values()):
            gs.running(store, f"chat-{i}", "chat", e.port)
        gs.deploy(store, "solo")  # one replica on ra's engine: its drain is easy to follow
        gs.running(store, "solo-0", "solo", engines["ra"].port)
        gs.deploy(store, "flaky")  # one replica answers 500
        gs.running(store, "flaky-0", "flaky", bad.port)
        gs.running(store, "flaky-1", "flaky", engines["rb"].port)
        g = gs.gateway(url, None, log=str(tmp / "gw.log"))
        procs.append(g)
        base = f"http://127.0.0.1:{g.port}"
        for model, n in (("chat", 3), ("solo", 1), ("flaky", 2)):
            gs.wait_model(base, model, n)
        yield store, g, engines
    finally:
        for p in reversed(procs):
            p.stop()
        store.dispose()


def client(g, cls=openai.OpenAI):
    return cls(base_url=f"http://127.0.0.1:{g.port}/v1", api_key="none", max_retries=0, timeout=30)


def ask(c, model: str, who: str, question: str, debug: bool = True):
    """(replica, x-gpuflow-route, cached tokens) of one chat request."""
    raw = c.chat.completions.with_raw_response.create(
        model=model, messages=[system(who), {"role": "user", "content": question}], max_tokens=2,
        extra_headers=DEBUG if debug else None)
    r = raw.parse()
    return r.system_fingerprint, raw.headers.get("x-gpuflow-route"), r.usage.prompt_tokens_details.cached_tokens


def decisions(g, model: str, reason: str) -> float:
    return gs.metric(httpx.get(f"http://127.0.0.1:{g.port}/metrics").text, "gpuflow_gateway_route_decisions_total",
                     model=model, reason=reason)


def test_affinity_holds_and_the_choice_is_explained_only_when_asked(stack):
    _, g, _ = stack
    c = client(g)
    home = {}
    for who in ("acme", "globex", "initech", "umbrella"):
        home[who], header, cached = ask(c, "chat", who, "first question?")
        assert "reason=no-prefix" in header and cached == 0  # a new prefix: the least loaded replica
    for round_ in range(3):
        for who in home:
            replica, header, cached = ask(c, "chat", who, f"question {round_}?")
            assert replica == home[who]  # back where its prefix is cached, every time
            # the gateway's text is "\x00system\x01" + 2,000 + "\x00user\x01" + the question: 15 whole blocks of 128,
    # all inside the system prompt; the engine (blocks of 64) caches 2,024 characters of it: 31 blocks, 496 tokens
            assert "reason=prefix" in header and "matched=15/15 blocks" in header and "/8" in header, header
            assert cached >= 2000 // 4 - 16
    assert ask(c, "chat", "acme", "no header?", debug=False)[1] is None
    m = httpx.get(f"http://127.0.0.1:{g.port}/metrics").text
    assert gs.metric(m, "gpuflow_gateway_route_decisions_total", model="chat", reason="prefix") >= 12
    assert gs.metric(m, "gpuflow_gateway_prefix_match_ratio_count", model="chat") >= 17


async def test_the_imbalance_guard_spreads_a_hot_prefix(stack):
    _, g, _ = stack
    c = client(g, openai.AsyncOpenAI)
    try:
        before = decisions(g, "chat", "imbalance")

        async def one(i: int) -> str:
            r = await c.chat.completions.create(model="chat", max_tokens=40, messages=[
                system("hot"), {"role": "user", "content": f"q{i}"}])  # 40 tokens * 0.02 s: in flight ~0.8 s
            return r.system_fingerprint

        first = await one(-1)  # the prefix finds its home
        served = await asyncio.gather(*(one(i) for i in range(12)))  # 12 at once: 5 on home would put it 5 ahead
        assert served.count(first) < 12 and len(set(served)) >= 2, served  # it spilled to other replicas
        # home took what the slack allowed before the guard fired: max(2, ceil(8 / 2)) = 4 ahead, its 5th
        assert served.count(first) >= 5, served
        assert decisions(g, "chat", "imbalance") > before
    finally:
        await c.close()


def test_a_drained_replica_leaves_the_index(stack):
    store, g, engines = stack
    c = client(g)
    ask(c, "solo", "hooli", "hello?")
    replica, header, cached = ask(c, "solo", "hooli", "again?")
    assert "reason=prefix" in header and cached > 0
    gs.running(store, "solo-0", "solo", engines["ra"].port, "stopping")  # drained: out of the table
    gs.wait_model(f"http://127.0.0.1:{g.port}", "solo", 0)
    gs.running(store, "solo-0", "solo", engines["ra"].port)  # back, at the same address
    gs.wait_model(f"http://127.0.0.1:{g.port}", "solo", 1)
    replica, header, cached = ask(c, "solo", "hooli", "and again?")
    # the gateway forgot what it sent there (a drained replica's cache is gone, as far as it knows);
    # this stand-in kept its cache, which shows the index, not the engine, made the choice
    assert "reason=no-prefix" in header and "matched=0/" in header and cached > 0


def test_retries_still_work_before_the_first_byte(stack):
    _, g, _ = stack
    c = client(g)
    # each new prefix goes to either replica (both idle): the one answering 500 is tried, with
    # odds of 1 - 2**-20 over 20 requests, then marked bad and skipped
    served = [ask(c, "flaky", f"customer{i}", "hi?")[0] for i in range(20)]
    assert served == ["rb"] * 20  # retried away from the 500, nothing failed
    m = httpx.get(f"http://127.0.0.1:{g.port}/metrics").text
    assert gs.metric(m, "gpuflow_gateway_requests_total", model="flaky", code="200") == 20
    assert gs.metric(m, "gpuflow_gateway_requests_total", model="flaky") == 20
    assert gs.metric(m, "gpuflow_gateway_route_decisions_total", model="flaky") > 20  # a retry is a new decision
