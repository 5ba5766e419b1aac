"""Cache-aware routing on the dev stack (issue 27, "Done when"): one fresh ``gpuflow dev``, the
stand-in engine with a prefix cache (tests/standin_cache_engine.py) deployed as a custom backend
with ``gpuflow deploy`` as a user would, and the official ``openai`` client against the dev
gateway asking for ``x-gpuflow-debug: route``. Affinity holds, the imbalance guard fires, a
drained replica leaves the index, and retries still work. tests/test_routing_live.py checks the
same on a gateway over a store written by hand; here the replicas, their drain and their deaths
are the control plane's and the agent's."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading

import httpx2 as httpx
import pytest

from tests import gateway_stack as gs
from tests.dev_stack import Dev, until

openai = pytest.importorskip("openai")
pytest.importorskip("gateway.app", reason="gpuflow gateway is not in this checkout")

ENGINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin_cache_engine.py")
DEBUG = {"x-gpuflow-debug": "route"}
# deployment -> (replicas, the gateway's limit per replica)
DEPLOYMENTS = {"chat": (3, 8), "duo": (2, 4), "pair": (2, 4)}


def spec(name: str, replicas: int, limit: int) -> dict:
    """A custom-backend spec running the stand-in; each process names itself by its port (its
    answers' ``system_fingerprint``), so an answer says which process made it."""
    return {"name": name, "backend": "custom", "replicas": replicas, "max_concurrency": limit,
            "source": {"local_path": f"/models/{name}"},
            "run_command": f"{sys.executable} {ENGINE} --port {{port}} --host {{host}} --name r{{port}} "
                           "--prefill-block-s 0.002 --token-s 0.02",
            "resources": {"vram": 2 * 2**30, "ram": 2**30}}


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("routing-dev")
    d = Dev(tmp)
    try:
        for name, (replicas, limit) in DEPLOYMENTS.items():
            (tmp / f"{name}.json").write_text(json.dumps(spec(name, replicas, limit)))
            d.run("deploy", str(tmp / f"{name}.json"))
        for name, (replicas, _) in DEPLOYMENTS.items():
            gs.wait_model(base(d), name, replicas, timeout=90, every=0.3)
        yield d
    finally:
        d.stop()


def base(d: Dev) -> str:
    return f"http://127.0.0.1:{d.gw_port}"


def system(who: str) -> dict:
    """A customer's long system prompt: 2,000 characters."""
    return {"role": "system", "content": (f"You are {who}'s assistant. " * 100)[:2000]}


def route(header: str | None) -> dict[str, str]:
    """``replica=chat-1; matched=15/15 blocks; load=0/8; reason=prefix`` as a dict."""
    assert header, "no x-gpuflow-route header"
    return dict(part.split("=", 1) for part in header.split("; "))


def client(d: Dev, cls=openai.OpenAI):
    return cls(base_url=d.gateway, api_key="none", max_retries=0, timeout=30)


def ask(c, model: str, who: str, question: str) -> tuple[dict, str, int]:
    """(x-gpuflow-route read, the answering process's name, cached tokens) of one chat request."""
    raw = c.chat.completions.with_raw_response.create(
        model=model, messages=[system(who), {"role": "user", "content": question}], max_tokens=2, extra_headers=DEBUG)
    r = raw.parse()
    return route(raw.headers.get("x-gpuflow-route")), r.system_fingerprint, r.usage.prompt_tokens_details.cached_tokens


def metric(d: Dev, name: str, **labels) -> float:
    return gs.metric(httpx.get(f"{base(d)}/metrics").text, name, **labels)


def processes(d: Dev, model: str) -> dict[str, str]:
    """Replica -> the name its stand-in gave itself (r<port>), from ``status --json``."""
    return {i["name"]: f"r{i['port']}" for i in d.instances(model) if i["state"] == "running"}


# The gateway's text is "\x00system\x01" + 2,000 + "\x00user\x01" + a short question: 2,026 characters,
# 15 whole blocks of 128, all inside the system prompt (15 * 128 = 1,920 <= 2,008). The engine's text is
# "system: " + 2,000 + "\n" + "user: " + the question + "\n": 31 whole blocks of 64 (1,984 characters;
# the 32nd would need 2,048) whose 31st ends inside the system prompt, so a repeat finds them all
# cached: 1,984 / 4 = 496 tokens.
FULL, CACHED = "15/15", 496


def test_affinity_holds_on_the_dev_stack(dev):
    c = client(dev)
    names = processes(dev, "chat")
    home = {}
    for who in ("acme", "globex", "initech", "umbrella"):
        r, fingerprint, cached = ask(c, "chat", who, "first question?")
        assert (r["reason"], r["matched"], cached) == ("no-prefix", "0/15 blocks", 0), r
        assert fingerprint == names[r["replica"]]  # the header names the process that answered
        home[who] = r["replica"]
    # a new prefix goes to the replica holding the fewest blocks: the first three spread over all three
    assert sorted(home[w] for w in ("acme", "globex", "initech")) == sorted(names), home
    for round_ in range(2):
        for who in home:
            r, fingerprint, cached = ask(c, "chat", who, f"question {round_}?")
            assert (r["replica"], r["reason"], r["matched"]) == (home[who], "prefix", f"{FULL} blocks"), r
            assert fingerprint == names[home[who]] and cached == CACHED  # the engine agrees: its cache held it
    assert metric(dev, "gpuflow_gateway_route_decisions_total", model="chat", reason="prefix") >= 8


async def test_the_imbalance_guard_fires_when_one_replica_is_flooded(dev):
    c = client(dev, openai.AsyncOpenAI)
    try:
        before = metric(dev, "gpuflow_gateway_route_decisions_total", model="chat", reason="imbalance")

        async def stream(i: int) -> tuple[dict, str]:
            raw = await c.chat.completions.with_raw_response.create(
                model="chat", messages=[system("hot"), {"role": "user", "content": f"q{i}"}], max_tokens=60,
                stream=True, extra_headers=DEBUG)  # 60 tokens * 0.02 s: each in flight 1.2 s, all 12 at once
            text = "".join([ch.choices[0].delta.content or "" async for ch in raw.parse() if ch.choices])
            return route(raw.headers.get("x-gpuflow-route")), text

        first, _ = await stream(-1)  # the prefix finds its home
        got = await asyncio.gather(*(stream(i) for i in range(12)))
        assert all(text == "".join(f"tok{i} " for i in range(60)) for _, text in got)  # every stream whole
        served = [r["replica"] for r, _ in got]
        counts = {x: served.count(x) for x in set(served)}
        # limit 8: slack = max(2, ceil(8 / 2)) = 4. Home takes 5 (at 5 in flight, 5 - 0 > 4 passes it over);
        # the 6th spills to an idle replica (reason imbalance), which then holds the prefix and takes 5 too;
        # the 11th spills to the last idle one (imbalance again), which takes the last 2: 5 + 5 + 2 = 12
        assert counts[first["replica"]] == 5 and sorted(counts.values()) == [2, 5, 5], served
        assert [r["reason"] for r, _ in got].count("imbalance") == 2, got
        assert metric(dev, "gpuflow_gateway_route_decisions_total", model="chat", reason="imbalance") == before + 2
    finally:
        await c.close()


def test_a_drained_replica_leaves_the_index(dev):
    c = client(dev)
    names = processes(dev, "duo")
    home = {who: ask(c, "duo", who, "hello?")[0]["replica"] for who in ("hooli", "piper")}
    assert sorted(home.values()) == sorted(names), home  # one prefix on each replica
    for who in home:
        r, _, cached = ask(c, "duo", who, "again?")
        assert (r["replica"], r["reason"], cached) == (home[who], "prefix", CACHED), r

    # a long stream on each replica (1,500 tokens * 0.02 s = 30 s: the scale, its drain seen and the gateway's
    # table read take seconds, more on a loaded machine), then one replica is scaled away
    started, done = threading.Barrier(3), {}

    def long_stream(who: str) -> None:
        raw = c.chat.completions.with_raw_response.create(
            model="duo", messages=[system(who), {"role": "user", "content": "tell me more"}], max_tokens=1500,
            stream=True, extra_headers=DEBUG)
        started.wait(10)
        done[who] = (route(raw.headers.get("x-gpuflow-route"))["replica"],
                     "".join(ch.choices[0].delta.content or "" for ch in raw.parse() if ch.choices))

    threads = [threading.Thread(target=long_stream, args=(who,)) for who in home]
    for t in threads:
        t.start()
    started.wait(10)
    dev.run("scale", "duo", "1")
    draining = until("a duo replica draining", lambda: [i["name"] for i in dev.instances("duo")
                                                        if i["state"] == "draining"], 20, 0.2)
    gone, = draining
    kept, = set(names) - {gone}
    gs.wait_model(base(dev), "duo", 1, timeout=10)  # out of the gateway's table while it finishes
    who_gone = next(w for w, r in home.items() if r == gone)
    # while the drained replica still runs its stream, its prefix goes to the other one, from scratch
    r, _, cached = ask(c, "duo", who_gone, "where now?")
    assert (r["replica"], r["reason"], r["matched"], cached) == (kept, "no-prefix", "0/15 blocks", 0), r
    assert not done  # and its own stream is still going
    for t in threads:
        t.join(60)
    whole = "".join(f"tok{i} " for i in range(1500))
    assert done == {w: (home[w], whole) for w in home}, done  # the drain let both streams finish
    r, _, cached = ask(c, "duo", who_gone, "and now?")  # its new home holds it
    assert (r["replica"], r["reason"], r["matched"], cached) == (kept, "prefix", f"{FULL} blocks", CACHED), r
    until("duo down to one replica", lambda: [i["name"] for i in dev.instances("duo")] == [kept], 30)
    assert metric(dev, "gpuflow_gateway_requests_total", model="duo") == metric(
        dev, "gpuflow_gateway_requests_total", model="duo", code="200") == 8  # 2 + 2 + 2 streams + 2


def test_a_killed_replica_is_retried_before_the_first_byte(dev):
    c = client(dev)
    rows = {i["name"]: i for i in dev.instances("pair")}
    home = {who: ask(c, "pair", who, "hello?")[0]["replica"] for who in ("wayne", "stark")}
    assert sorted(home.values()) == sorted(rows), home
    victim = home["wayne"]
    pid = rows[victim]["pid"]
    with open(f"/proc/{pid}/cmdline", "rb") as f:  # the stand-in the agent started, nothing else
        assert ENGINE.encode() in f.read()
    decisions = metric(dev, "gpuflow_gateway_route_decisions_total", model="pair")
    os.kill(pid, signal.SIGKILL)
    # wayne's prefix points at the dead replica: refused at connect, retried on the other, no error
    served = [ask(c, "pair", who, f"after {i}?")[0] for i in range(3) for who in ("wayne", "stark")]
    assert {r["replica"] for r in served} == set(rows) - {victim}, served
    # 2 + 6 answered, all 200; the first of wayne's after the kill was decided twice
    assert metric(dev, "gpuflow_gateway_requests_total", model="pair", code="200") == 8
    assert metric(dev, "gpuflow_gateway_requests_total", model="pair") == 8
    assert metric(dev, "gpuflow_gateway_route_decisions_total", model="pair") >= decisions + 7
    # the agent restarts the killed replica
    until(f"{victim} RUNNING again", lambda: any(i["name"] == victim and i["state"] == "running" and i["restarts"]
                                                 for i in dev.instances("pair")), 30)
