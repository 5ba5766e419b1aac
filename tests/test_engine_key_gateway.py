"""A real gateway in front of stand-in engines behind their keys (issue 40), over a real store: the
gateway sends each replica the key the store made for it, and of a client's headers only the
allowed ones (the engine names the headers that reached it: x-headers-seen). A Cookie, an invented
header and the client's Authorization never reach it. A replica whose engine refuses the gateway's
key (its host not joined: the store has none for it) is a 502 naming that, never a 401 that a
client would read as its own key refused."""

from __future__ import annotations

import sys

import httpx2 as httpx

from contracts import credential as cr
from contracts.control import InstanceRecord
from gpuflow.ports import server_port
from store import host_credentials, records
from tests import gateway_stack as gs
from tests.gateway_stack import procs, sqlite_store  # noqa: F401  (fixtures)
from worker_agent.credential import HostCredential
from worker_agent.engine_key import new_nonce

HOST = bytes(range(32, 64))


def key_of(store, instance: str, nonce: str) -> str:
    """Host w1 joins the store's cluster; the key its agent makes for ``instance``'s launch."""
    cluster = host_credentials.ensure_cluster(store)
    assert host_credentials.accept(store, "w1", cr.public_of(HOST))
    agent = HostCredential(name="w1", public=cr.public_of(HOST), key=cr.host_key(HOST, cluster.public), proof="",
                           cluster=cluster.public)
    return agent.engine_key(instance, "", nonce)


def keyed_engine(procs, name: str, key: str) -> gs.Proc:
    port = server_port()
    eng = gs.Proc([sys.executable, f"{gs.HERE}/standin_engine.py", "--port", str(port), "--name", name,
                   "--api-key", key], port)
    procs.append(eng)
    return eng


def running(store, instance: str, deployment: str, port: int, nonce: str | None, worker: str = "w1") -> None:
    records.record_instance(store, InstanceRecord(name=instance, deployment=deployment, model=deployment,
                                                  state="running", worker=worker, port=port, address="127.0.0.1",
                                                  key_id=nonce),
                           check_launch=False)  # a fixture's row: no agent launched it (store/engine_keys.py)


def test_the_engine_gets_its_key_and_only_the_allowed_headers(sqlite_store, procs):
    url, schema, store = sqlite_store
    nonce = new_nonce()
    eng = keyed_engine(procs, "r1", key_of(store, "m-0", nonce))
    gs.deploy(store, "m")
    running(store, "m-0", "m", eng.port, nonce)
    g = gs.gateway(url, schema)
    procs.append(g)
    base = f"http://127.0.0.1:{g.port}"
    gs.wait_model(base, "m", 1)
    r = httpx.post(f"{base}/v1/chat/completions", timeout=10,
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                   headers={"Cookie": "gpuflow_session=s3cr3t", "X-Invented": "1", "X-Request-Id": "other-tenants-id",
                            "Authorization": "Bearer the-clients-own-key", "Accept-Encoding": "gzip",
                            "User-Agent": "client/1.0"})
    assert r.status_code == 200, r.text  # the engine took the gateway's key, not the client's
    seen = set(r.headers["x-headers-seen"].split(","))
    assert {"cookie", "x-invented", "x-request-id", "accept-encoding", "user-agent"} & seen == set()
    assert {"authorization", "content-type"} <= seen
    assert httpx.post(f"http://127.0.0.1:{eng.port}/v1/chat/completions", timeout=10,
                      json={"model": "m", "messages": []}).status_code == 401  # the port alone: nothing


def test_an_engine_refusing_the_gateways_key_is_a_502_naming_it(sqlite_store, procs):
    """Its host never joined: the store makes no key for it, the gateway sends none, the engine
    (started with a key) refuses: the client reads that the replica refused the gateway."""
    url, schema, store = sqlite_store
    eng = keyed_engine(procs, "r1", "gfe-" + "B" * 43)
    gs.deploy(store, "m")
    running(store, "m-0", "m", eng.port, new_nonce(), worker="stranger")
    g = gs.gateway(url, schema)
    procs.append(g)
    base = f"http://127.0.0.1:{g.port}"
    gs.wait_model(base, "m", 1)
    r = httpx.post(f"{base}/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1}, timeout=10)
    assert r.status_code == 502 and "refused the gateway's engine key" in r.json()["error"]["message"], r.text
