"""The engines' KV-cache events as the gateway meets them: a real ``gpuflow gateway`` process in
front of two stand-in engines (tests/standin_cache_engine.py) that tokenize with one real
tokenizer and publish their cache's changes in vLLM's format over real ZMQ, over a real store,
driven by the official ``openai`` client.

An eviction the gateway never caused (requests sent straight to one engine push a customer's
prefix out of its small LRU) makes the gateway stop counting that prefix as cached there: its
text index still says so, the engine's events say otherwise, and the events win. A publisher of
garbage is counted and dropped, and the gateway keeps serving."""

from __future__ import annotations

import time

import httpx2 as httpx
import openai
import pytest
import zmq

from contracts.control import InstanceRecord
from gpuflow.ports import server_port
from store import db, records
from tests import gateway_stack as gs
from tests.standin_cache_engine import make_tokenizer

DEBUG = {"x-gpuflow-debug": "route"}
BLOCKS = 40  # each engine's cache: 40 blocks of 16 tokens


def system(who: str) -> dict:
    return {"role": "system", "content": (f"You are {who}'s assistant. Answer briefly and politely. " * 12)[:600]}


def running(store, instance: str, deployment: str, port: int, kv_port: int) -> None:
    records.record_instance(store, InstanceRecord(name=instance, deployment=deployment, model=deployment,
                                                  state="running", worker="w1", port=port, address="127.0.0.1",
                                                  kv_events_port=kv_port),
                           check_launch=False)  # a fixture's row: no agent launched it (store/engine_keys.py)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kv")
    tok = make_tokenizer(str(tmp / "tokenizer"))
    url = db.sqlite_url(str(tmp / "gpuflow.db"))
    store = db.make_engine(url)
    db.init_db(store)
    procs: list[gs.Proc] = []
    rogue = zmq.Context.instance().socket(zmq.PUB)
    rogue_port = server_port()
    rogue.bind(f"tcp://127.0.0.1:{rogue_port}")
    try:
        kv = {n: server_port() for n in ("ea", "eb")}
        engines = {n: gs.cache_engine(n, log=str(tmp / f"{n}.log"), tokenizer=tok, block_tokens=16,
                                      cache_blocks=BLOCKS, kv_events_port=kv[n], prefill_block_s=0.001, token_s=0.005)
                   for n in kv}
        procs += engines.values()
        gs.deploy(store, "chat", max_concurrency=4, source={"local_path": tok})
        for i, (n, e) in enumerate(engines.items()):
            running(store, f"chat-{i}", "chat", e.port, kv[n])
        gs.deploy(store, "junk", source={"local_path": tok})  # its events port is a publisher of garbage
        running(store, "junk-0", "junk", engines["eb"].port, rogue_port)
        g = gs.gateway(url, None, "--tokenizer-root", str(tmp), log=str(tmp / "gw.log"))
        procs.append(g)
        base = f"http://127.0.0.1:{g.port}"
        gs.wait_model(base, "chat", 2)
        yield g, engines, rogue
    finally:
        for p in reversed(procs):
            p.stop()
        rogue.close(linger=0)
        store.dispose()


def client(g):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{g.port}/v1", api_key="none", max_retries=0, timeout=30)


def ask(c, who: str, question: str = "What is the weather like?"):
    """(x-gpuflow-route as a dict, replica, cached tokens) of one chat request."""
    raw = c.chat.completions.with_raw_response.create(
        model="chat", messages=[system(who), {"role": "user", "content": question}], max_tokens=2,
        extra_headers=DEBUG)
    r = raw.parse()
    route = dict(kv.strip().split("=", 1) for kv in raw.headers["x-gpuflow-route"].split(";"))
    return route, r.system_fingerprint, r.usage.prompt_tokens_details.cached_tokens


def metrics(g) -> str:
    return httpx.get(f"http://127.0.0.1:{g.port}/metrics").text


def test_an_eviction_the_gateway_did_not_cause_is_seen_through_the_engines_events(stack):
    g, engines, _ = stack
    c = client(g)
    # until both engines' events arrive (a SUB socket joins late: its first messages may be lost),
    # new customers' prompts are routed on the text index
    n = 0
    while True:
        route, _, _ = ask(c, f"warmup{n}")
        n += 1
        if gs.metric(metrics(g), "gpuflow_gateway_kv_event_batches_total", result="ok") >= 2 and n >= 2:
            route, _, _ = ask(c, f"warmup{n}")
            if route["index"] == "kv-events":
                break
        assert n < 50, route
    first, at, _ = ask(c, "acme")
    assert first["index"] == "kv-events" and first["tokens"].startswith("0/"), first  # a new prefix: nothing held
    total = int(first["tokens"].split("/")[1])
    again, where, cached = ask(c, "acme")
    held = total // 16 * 16  # every whole block of 16 tokens
    assert (where, again["replica"]) == (at, first["replica"]), (first, again)
    assert again["tokens"] == f"{held}/{total}" and again["reason"] == "prefix", again
    assert cached >= held - 16  # the engine agrees (its own count: the prompt's blocks, less the generation prompt's)
    # four other customers straight to that engine (another gateway's traffic): 4 x 11 blocks, and
    # its LRU of 40 evicts every block of acme's, publishing BlockRemoved (one batch per request)
    ok = gs.metric(metrics(g), "gpuflow_gateway_kv_event_batches_total", result="ok")
    for who in ("x1", "x2", "x3", "x4"):
        r = httpx.post(f"http://127.0.0.1:{engines[at].port}/v1/chat/completions", timeout=10, json={
            "model": "chat", "messages": [system(who), {"role": "user", "content": "hello"}], "max_tokens": 1})
        assert r.status_code == 200
    gs.wait_for(lambda: gs.metric(metrics(g), "gpuflow_gateway_kv_event_batches_total", result="ok") >= ok + 4,
                10, "the 4 batches of events")
    route, where, cached = ask(c, "acme")
    # the text index still held acme's blocks on that replica; the engine's events say they are gone
    assert route["index"] == "kv-events" and route["tokens"] == f"0/{total}", route
    assert route["matched"].startswith("0/"), route
    assert cached == 0  # and the engine did prefill it all again


def test_garbage_on_an_events_port_is_counted_and_dropped(stack):
    g, _, rogue = stack
    before = gs.metric(metrics(g), "gpuflow_gateway_kv_event_batches_total", result="malformed")
    end = time.monotonic() + 10
    while gs.metric(metrics(g), "gpuflow_gateway_kv_event_batches_total", result="malformed") < before + 3:
        rogue.send_multipart([b"only one frame"])
        rogue.send_multipart([b"t", b"short", b"\x90"])  # the sequence number is not 8 bytes
        rogue.send_multipart([b"t", (7).to_bytes(8, "big"), b"\xc1 not msgpack"])
        time.sleep(0.2)
        assert time.monotonic() < end, "the gateway never counted the garbage"
    assert httpx.get(f"http://127.0.0.1:{g.port}/healthz").status_code == 200
    route, _, _ = ask(client(g), "still-serving")
    assert route["replica"].startswith("chat-")
