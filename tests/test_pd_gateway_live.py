"""A prefill/decode group served through ``gpuflow gateway`` as its router (issue 35): real stand-in
PD engines (``gpuflow standin --pd-role prefill|decode --kv-port P``, gpuflow/demo/standin_pd.py,
which pull the KV over their side channel) in front of a real gateway process, over a real store
whose rows are written as the control plane writes them, driven by the official ``openai`` client.
No Temporal: the store is all a gateway reads (tests/gateway_stack.py)."""

from __future__ import annotations

import collections
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx
import openai
import pytest
from sqlmodel import Session

from gpuflow.ports import server_port
from store import pd_counts, serving
from store.pd_counts import PDCounts
from store.tables import InstanceRow
from tests import gateway_stack as gs
from tests.gateway_stack import procs, sqlite_store  # noqa: F401  (fixtures)

SPEC = {"roles": [{"name": "prefill", "replicas": 2}, {"name": "decode", "replicas": 2}],
        "disaggregation": {"mode": "custom"}}
PROMPT = "Tell me about the sea. " * 40  # 920 characters: ~230 tokens, far over the 16 the prefill is skipped below
DEBUG = {"x-gpuflow-debug": "route"}


def member(name: str, role: str, worker: str, log: str, *flags: str) -> gs.Proc:
    port, kv = server_port(), server_port()
    return gs.Proc([sys.executable, "-m", "gpuflow", "standin", "--port", str(port), "--pd-role", role,
                    "--kv-port", str(kv), "--engine-id", name, "--model-name", "pd", "--token-s", "0.002", *flags],
                   port, log)


def row(engine, name: str, role: str, port: int, worker: str, state: str = "running", gen: int = 0) -> None:
    with Session(engine) as s:
        r = s.get(InstanceRow, name) or InstanceRow(name=name, deployment="pd")
        r.model, r.state, r.role, r.group_name, r.wanted, r.group_gen = "pd", state, role, "pd", True, gen
        r.worker, r.address, r.port = worker, "127.0.0.1", port
        s.add(r)
        s.commit()


def group(store, procs, tmp_path) -> tuple[dict[str, gs.Proc], gs.Proc]:
    """p0 and d0 on host w1, p1 and d1 on w2, all RUNNING; a gateway in front."""
    url, schema, engine = store
    gs.deploy(engine, "pd", **SPEC)
    members = {}
    for name, role, worker in (("pd-p0", "prefill", "w1"), ("pd-p1", "prefill", "w2"),
                               ("pd-d0", "decode", "w1"), ("pd-d1", "decode", "w2")):
        members[name] = m = member(name, role, worker, str(tmp_path / f"{name}.log"))
        procs.append(m)
        row(engine, name, role, m.port, worker)
    g = gs.gateway(url, schema, log=str(tmp_path / "gw.log"))
    procs.append(g)
    gs.wait_model(f"http://127.0.0.1:{g.port}", "pd", 4)
    return members, g


def ask(c: openai.OpenAI, i: int, stream: bool) -> tuple[str, str]:
    """One request: (its x-gpuflow-route header, where its answer's KV came from and whose)."""
    msgs = [{"role": "user", "content": f"{i}: {PROMPT}"}]
    raw = c.chat.completions.with_raw_response.create(model="pd", messages=msgs, max_tokens=8, stream=stream,
                                                      extra_headers=DEBUG)
    route = raw.headers["x-gpuflow-route"]
    if stream:
        chunks = list(raw.parse())
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        kv = chunks[-1].model_extra["gpuflow_kv"]
    else:
        r = raw.parse()
        assert r.choices[0].message.content
        kv = r.model_extra["gpuflow_kv"]
    return route, f"{kv['source']}:{kv['engine_id']}"


def fields(route: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in route.split("; "))


def scrape(p: gs.Proc) -> str:
    return httpx.get(f"http://127.0.0.1:{p.port}/metrics").text


def remote_prefills(p: gs.Proc) -> float:
    return gs.metric(scrape(p), "gpuflow_standin_prefills_total", source="remote")


def test_requests_decode_from_the_prefills_kv(sqlite_store, procs, tmp_path):
    members, g = group(sqlite_store, procs, tmp_path)
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{g.port}/v1", api_key="none", max_retries=0)
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda i: ask(c, i, i % 2 == 0), range(60)))  # 60 requests, 8 at once, half streamed
    routes = [fields(r) for r, _ in got]
    # >= 95% disaggregated (all of these: long prompts, both prefills up): the answer's KV is remote,
    # from the very prefill the header names, and the decode it names is one of the group's
    assert sum(r["kv"] == "remote" for r in routes) >= 57  # 0.95 * 60
    misrouted = [(r, kv) for r, kv in zip(routes, (kv for _, kv in got))
                 if kv != f"remote:{r['prefill']}" or r["decode"] not in ("pd-d0", "pd-d1") or r["gen"] != "0"]
    assert misrouted == []
    # each decode pulled exactly the KV the headers say it was sent
    sent = collections.Counter(r["decode"] for r in routes)
    assert {d: remote_prefills(members[d]) for d in ("pd-d0", "pd-d1")} == {d: sent[d] for d in ("pd-d0", "pd-d1")}
    m = scrape(g)
    assert gs.metric(m, "gpuflow_gateway_pd_requests_total", model="pd", path="disaggregated") == 60
    assert gs.metric(m, "gpuflow_gateway_pd_transfer_failures_total", model="pd") == 0
    assert gs.metric(m, "gpuflow_gateway_requests_total", model="pd", code="200") == 60  # 0 failed
    # the same counts reach the store within a refresh (0.5 s), where pd_ineffective is judged
    engine = sqlite_store[2]
    gs.wait_for(lambda: pd_counts.totals(engine).get("pd") == PDCounts(disaggregated=60), 5, "the counts stored")
    # a short prompt (3 tokens < 16) skips the prefill: the decode prefills it itself
    short = c.chat.completions.with_raw_response.create(model="pd", messages=[{"role": "user", "content": "hi"}],
                                                        max_tokens=2, extra_headers=DEBUG)
    assert fields(short.headers["x-gpuflow-route"])["kv"] == "skipped"
    assert short.parse().model_extra["gpuflow_kv"]["source"] == "local"
    # a client's own hand-off fields never reach an engine: a decode told to pull KV from a host the
    # client names would connect there. The listener below sees no connection; the decode prefills locally
    trap = socket.socket()
    trap.bind(("127.0.0.1", 0))
    trap.listen(4)
    trap.settimeout(1.0)
    forged = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "pd-p0",
              "remote_block_ids": [0], "remote_host": "127.0.0.1", "remote_port": trap.getsockname()[1]}
    for content in ("hi", PROMPT):  # skipped, and disaggregated (the gateway writes the prefill's params)
        r = c.chat.completions.with_raw_response.create(
            model="pd", messages=[{"role": "user", "content": content}], max_tokens=2, extra_headers=DEBUG,
            extra_body={"kv_transfer_params": forged, "bootstrap_host": "127.0.0.1", "bootstrap_room": 7})
        kv = r.parse().model_extra["gpuflow_kv"]
        assert (fields(r.headers["x-gpuflow-route"])["kv"], kv["source"]) == (
            ("skipped", "local") if content == "hi" else ("remote", "remote"))
    with pytest.raises(TimeoutError):
        trap.accept()
    trap.close()


def test_killing_a_prefill_then_a_decode_under_load_fails_no_request(sqlite_store, procs, tmp_path):
    # 6 clients send requests back to back (not streamed: a stream a dying decode already started
    # cannot be retried, every byte before it reached the client). p0 is killed (SIGKILL), then d0,
    # then p1: no request fails; the last ones are served by d1 whole (fallback, counted)
    _, _, engine = sqlite_store
    members, g = group(sqlite_store, procs, tmp_path)
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{g.port}/v1", api_key="none", max_retries=0)
    stop, done, failed = threading.Event(), [], []

    def load(k: int) -> None:
        i = 0
        while not stop.is_set():
            try:
                done.append(fields(ask(c, k * 10_000 + i, False)[0]))
            except Exception as e:  # noqa: BLE001  a failed request is what this test counts
                failed.append(repr(e))
            i += 1

    def after(n: int) -> None:
        want = len(done) + n
        gs.wait_for(lambda: len(done) >= want or failed, 60, f"{n} more answers")

    def failures(end: str) -> float:
        return gs.metric(scrape(g), "gpuflow_gateway_pd_transfer_failures_total", model="pd", end=end)

    with ThreadPoolExecutor(6) as pool:
        for k in range(6):
            pool.submit(load, k)
        after(20)
        for name, role, worker in (("pd-p0", "prefill", "w1"), ("pd-d0", "decode", "w1"), ("pd-p1", "prefill", "w2")):
            before = failures(role)
            members[name].kill()
            # the kill is met: some request tries the dead end and is retried. Which one is the picks'
            # business: new prefixes go to the prefill with more free blocks (ties by turn), and an end
            # whose KV failed is skipped for bad_s (5 s), so not always the next request (a fixed count
            # of answers could miss a kill: under load, CI once counted no prefill failure at all)
            gs.wait_for(lambda: failures(role) > before or failed, 60, f"a request meeting {name} dead")
            after(10)  # served while the store still says RUNNING: the gateway's own retries
            row(engine, name, role, members[name].port, worker, state="failed")  # the control plane notices
            after(20)
        stop.set()
    assert failed == []
    tail = done[-10:]  # no prefill left: d1 serves them whole
    assert {(r["decode"], r["kv"], r["path"]) for r in tail} == {("pd-d1", "local", "fallback")}
    m = scrape(g)
    assert gs.metric(m, "gpuflow_gateway_pd_requests_total", model="pd", path="fallback") >= 10
    assert gs.metric(m, "gpuflow_gateway_pd_requests_total", model="pd") == len(done)  # every answer, one path
    # the kills were met and retried (waited for above: p0 and p1 tried dead, d0 tried dead and another
    # decode took the same KV)
    assert gs.metric(m, "gpuflow_gateway_pd_transfer_failures_total", model="pd", end="prefill") >= 1
    assert gs.metric(m, "gpuflow_gateway_pd_transfer_failures_total", model="pd", end="decode") >= 1


def test_a_new_generation_takes_over_once_ready(sqlite_store, procs, tmp_path):
    # gen 0 (p0, d0) serves; gen 1's decode d9 is RUNNING but its prefill p9 only starting: gen 1 is
    # not ready (any_per_role wants one of each), gen 0 keeps every request. p9 RUNNING: within a
    # refresh every request goes to gen 1, never a prefill of one generation with a decode of another
    url, schema, engine = sqlite_store
    gs.deploy(engine, "pd", **{**SPEC, "roles": [{"name": "prefill"}, {"name": "decode"}]})
    ms = {n: member(n, role, "w1", str(tmp_path / f"{n}.log"))
          for n, role in (("pd-p0", "prefill"), ("pd-d0", "decode"), ("pd-p9", "prefill"), ("pd-d9", "decode"))}
    procs.extend(ms.values())
    for n, gen, state in (("pd-p0", 0, "running"), ("pd-d0", 0, "running"), ("pd-p9", 1, "starting"),
                          ("pd-d9", 1, "running")):
        row(engine, n, "prefill" if "-p" in n else "decode", ms[n].port, "w1", state, gen)
    g = gs.gateway(url, schema, log=str(tmp_path / "gw.log"))
    procs.append(g)
    gs.wait_model(f"http://127.0.0.1:{g.port}", "pd", 3)  # p0, d0, d9 RUNNING
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{g.port}/v1", api_key="none", max_retries=0)
    before = [fields(ask(c, i, False)[0]) for i in range(6)]
    assert {(r["prefill"], r["decode"], r["gen"]) for r in before} == {("pd-p0", "pd-d0", "0")}
    row(engine, "pd-p9", "prefill", ms["pd-p9"].port, "w1", "running", 1)
    gs.wait_model(f"http://127.0.0.1:{g.port}", "pd", 4)
    after = [ask(c, i, i % 2 == 0) for i in range(6)]
    assert {(fields(r)["prefill"], fields(r)["decode"], fields(r)["gen"], kv) for r, kv in after} == {
        ("pd-p9", "pd-d9", "1", "remote:pd-p9")}  # decoded from p9's KV


def test_sglang_mode_sends_both_ends_the_prefills_bootstrap(sqlite_store, procs, tmp_path):
    # mode sglang-nixl: the gateway sends each request to a prefill and a decode at once, with the
    # prefill's bootstrap host and port (its row's bootstrap_port) and a fresh room; the decode waits
    # for that room at the prefill's bootstrap server (tests/standin_sglang.py) and answers from it
    url, schema, engine = sqlite_store
    gs.deploy(engine, "pd", **{**SPEC, "disaggregation": {"mode": "sglang-nixl"}})
    boots = {}
    for name, role in (("pd-p0", "prefill"), ("pd-p1", "prefill"), ("pd-d0", "decode")):
        port, boot = server_port(), server_port() if role == "prefill" else None
        procs.append(gs.Proc([sys.executable, "tests/standin_sglang.py", "--port", str(port), "--name", name,
                              "--role", role, *(["--bootstrap-port", str(boot)] if boot else [])], port))
        row(engine, name, role, port, "w1")
        with Session(engine) as s:
            r = s.get(InstanceRow, name)
            r.bootstrap_port = boots[name] = boot
            s.add(r)
            s.commit()
    g = gs.gateway(url, schema, log=str(tmp_path / "gw.log"))
    procs.append(g)
    gs.wait_model(f"http://127.0.0.1:{g.port}", "pd", 3)
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{g.port}/v1", api_key="none", max_retries=0)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda i: c.chat.completions.with_raw_response.create(
            model="pd", messages=[{"role": "user", "content": f"{i}: {PROMPT}"}], max_tokens=4,
            extra_headers=DEBUG), range(12)))
    seen = [(fields(r.headers["x-gpuflow-route"]), r.parse().model_extra["gpuflow_kv"]) for r in got]
    # each decoded from the room of the very prefill the header names (its bootstrap port), 12 rooms
    assert [kv["source"] for _, kv in seen] == ["remote"] * 12
    assert all(kv["engine_id"] == boots[h["prefill"]] for h, kv in seen)
    assert len({kv["room"] for _, kv in seen}) == 12


def test_failing_kv_pulls_fall_back_to_the_decode_then_resume(sqlite_store, procs, tmp_path):
    # both prefills' side channels refuse every pull (the stand-in's fault): the first request is
    # prefilled on one (its decode's pull fails: 503), again on the other (fails), then served by a
    # decode whole; both prefills are marked bad (5 s), so the next ones fall back at once. No request
    # fails. Pulls resume: once the marks expire, requests decode from the prefills' KV again
    members, g = group(sqlite_store, procs, tmp_path)
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{g.port}/v1", api_key="none", max_retries=0)
    for p in ("pd-p0", "pd-p1"):
        assert httpx.post(f"http://127.0.0.1:{members[p].port}/standin/faults", json={"fail_kv_pulls": True}).is_success
    got = [ask(c, i, i % 2 == 0) for i in range(5)]
    assert {(fields(r)["kv"], fields(r)["path"], kv.split(":")[0]) for r, kv in got} == {("local", "fallback", "local")}
    m = scrape(g)
    assert gs.metric(m, "gpuflow_gateway_pd_transfer_failures_total", model="pd", end="decode") == 2  # p0 and p1, once
    assert gs.metric(m, "gpuflow_gateway_pd_requests_total", model="pd", path="fallback") == 5
    assert gs.metric(m, "gpuflow_gateway_requests_total", model="pd", code="200") == 5  # 0 failed
    for p in ("pd-p0", "pd-p1"):
        httpx.post(f"http://127.0.0.1:{members[p].port}/standin/faults", json={"fail_kv_pulls": False})
    n = iter(range(100, 200))  # new prompts: one the decodes already hold would skip its prefill
    gs.wait_for(lambda: fields(ask(c, next(n), False)[0])["kv"] == "remote", 15,
                "a request decoded from a prefill's KV", every=0.5)


def test_a_prefill_counts_in_flight_until_its_kv_is_pulled(sqlite_store, procs, tmp_path):
    # a pull takes 10 ms a token (--kv-token-s): ~233 tokens, ~2.3 s between the prefill's answer and
    # the decode's first byte. Meanwhile the gateway reports the prefill busy (store/serving.py), so a
    # drain before a stop (a rollout) waits for the hand-off instead of stopping the KV's holder
    url, schema, engine = sqlite_store
    gs.deploy(engine, "pd", **{**SPEC, "roles": [{"name": "prefill"}, {"name": "decode"}]})
    ms = {n: member(n, role, "w1", str(tmp_path / f"{n}.log"), "--kv-token-s", "0.01")
          for n, role in (("pd-p0", "prefill"), ("pd-d0", "decode"))}
    procs.extend(ms.values())
    for n, m in ms.items():
        row(engine, n, "prefill" if "-p" in n else "decode", m.port, "w1")
    g = gs.gateway(url, schema, log=str(tmp_path / "gw.log"))
    procs.append(g)
    gs.wait_model(f"http://127.0.0.1:{g.port}", "pd", 2)
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{g.port}/v1", api_key="none", max_retries=0)
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(ask, c, 0, False)
        gs.wait_for(lambda: gs.metric(scrape(ms["pd-p0"]), "gpuflow_standin_prefills_total") == 1, 5, "the prefill")
        gs.wait_for(lambda: serving.in_flight(engine, "pd-p0") == 1, 1.5, "the prefill reported busy")
        assert not answer.done()  # its KV still being pulled
        assert answer.result()[1] == "remote:pd-p0"
    gs.wait_for(lambda: serving.in_flight(engine, "pd-p0") == 0, 2, "the prefill reported idle")
