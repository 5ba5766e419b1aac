"""Issue 40's keys and console findings, as the probe ran them, on real processes: ``gpuflow dev``
(the console, through Temporal) and a real ``gpuflow gateway`` over a store (/metrics, usage).

- M1: a DNS-rebinding page gets nothing from the open console: the probe's exact request
  (``POST /console/keys/create`` with ``Host: evil.example:PORT`` and ``Origin:
  http://evil.example:PORT``) and a GET of a page are answered 421, and no key is made;
- M7: a tenant-admin key is refused on another tenant's deployment (scale) and on making a key for
  another tenant, and may do both in its own;
- the lows: a key for a tenant that does not exist, ``admin: "yes"``, ``scale true`` and
  ``scale "3"`` are refused, naming the problem, by the CLI (exit 2) and by a raw Temporal update;
- M6: with ``--metrics-key-required``, a tenant's key gets 403 on /metrics, a metrics key reads it;
- M5: an engine reporting ``prompt_tokens: 2**70`` leaves every other key's usage counted."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import sys
import time

import openai
import pytest
from temporalio.client import WorkflowUpdateFailedError

from contracts.ids import CLUSTER_CREATE_KEY, CLUSTER_ID, DEPLOYMENT_SCALE, deployment_id
from gpuflow.runtime import connect
from gpuflow.settings import TemporalSettings
from store import key_usage, keys
from store.key_usage import Counts
from tests import gateway_stack as gs
from tests.dev_stack import Dev, until
from tests.gateway_stack import procs, sqlite_store  # noqa: F401  (fixtures)

ENGINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin_engine.py")
ACTION = {"x-gpuflow-console": "1", "content-type": "application/json"}


def ask(port: int, method: str, path: str, headers: dict, body: dict | None = None) -> tuple[int, str]:
    """One request with exactly these headers, ``Host`` included (http.client sends no other)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request(method, path, json.dumps(body).encode() if body is not None else None,
                  headers={"Host": f"127.0.0.1:{port}", **headers})
        r = c.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        c.close()


def spec(name: str, tenant: str, **kw) -> dict:
    return {"name": name, "backend": "custom", "tenant": tenant, "replicas": 1, "source": {"local_path": f"/m/{name}"},
            "run_command": f"{sys.executable} {ENGINE} --port {{port}} --host {{host}} --name {name}",
            "resources": {"vram": 2**30, "ram": 2**30}, **kw}


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    d = Dev(tmp_path_factory.mktemp("trust-keys"))
    try:
        yield d
    finally:
        d.stop()


def test_a_rebinding_page_gets_nothing_from_the_open_console(dev):
    """First, while no key exists: the console is open on loopback."""
    port = dev.gw_port
    evil = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
    status, body = ask(port, "POST", "/console/keys/create", {**evil, **ACTION},
                       {"tenant": "default", "name": "pwned", "scope": "cluster-admin"})
    assert status == 421 and "gpuflow-" not in body, (status, body)  # before: 200 and a new admin key's secret
    assert "does not answer to Host 'evil.example:" in body and f"127.0.0.1:{port}" in body
    for path in ("/console/", "/console/keys", "/v1/models", "/metrics"):  # a page, and the open API
        status, body = ask(port, "GET", path, evil)
        assert status == 421 and "<html" not in body.lower(), (path, status, body[:200])
    # its own name with the gateway's Host: the Origin is compared with the gateway's names, not with Host
    status, body = ask(port, "POST", "/console/keys/create", {"Origin": f"http://evil.example:{port}", **ACTION},
                       {"tenant": "default", "name": "pwned", "scope": "cluster-admin"})
    assert status == 403 and "another origin (http://evil.example:" in body, (status, body)
    assert json.loads(dev.run("keys", "list", "--json")) == []  # no key was made
    assert ask(port, "GET", "/console/", {})[0] == 200  # the operator's own loopback name is answered


@pytest.fixture(scope="module")
def keyed(dev):
    """team-a and team-b; b-chat (team-b's, shared with team-a, so team-a sees it) and a-chat
    (team-a's); a tenant-admin key of team-a and a cluster-admin key."""
    (dev.tmp / "tenants.json").write_text(json.dumps({"tenants": [{"name": "team-a"}, {"name": "team-b"}]}))
    dev.run("tenants", "apply", str(dev.tmp / "tenants.json"))
    for name, tenant, kw in (("b-chat", "team-b", {"shared_with": ["team-a"]}), ("a-chat", "team-a", {})):
        (dev.tmp / f"{name}.json").write_text(json.dumps(spec(name, tenant, **kw)))
        dev.run("deploy", str(dev.tmp / f"{name}.json"))
    a_admin = dev.run("keys", "create", "--tenant", "team-a", "--scope", "tenant-admin").split()[-1]
    root = dev.run("keys", "create", "--tenant", "default", "--admin").split()[-1]  # --admin on default
    until("the gateway wants a key", lambda: ask(dev.gw_port, "GET", "/v1/models", {})[0] == 401, timeout=10)
    return {"a_admin": {"Authorization": f"Bearer {a_admin}"}, "root": {"Authorization": f"Bearer {root}"}}


def test_a_tenant_admin_acts_in_its_own_tenant_only(dev, keyed):
    port, a = dev.gw_port, keyed["a_admin"]
    status, body = ask(port, "POST", "/console/deployments/b-chat/scale", {**a, **ACTION}, {"replicas": 3})
    assert status == 403, (status, body)  # M7: before, 200 and team-b's deployment scaled
    assert "need a tenant-admin key of tenant team-b or a cluster-admin key" in json.loads(body)["error"]
    assert ask(port, "POST", "/console/deployments/b-chat/delete", {**a, **ACTION}, {})[0] == 403
    assert dev.status("b-chat")["deployments"][0]["replicas"] == 1  # unchanged
    for scope in ("tenant-admin", "tenant"):  # M7: keys for another tenant
        status, body = ask(port, "POST", "/console/keys/create", {**a, **ACTION},
                           {"tenant": "team-b", "name": "x", "scope": scope})
        assert status == 403 and "a key of tenant team-b you need" in body and "gpuflow-" not in body, body
    status, body = ask(port, "POST", "/console/keys/create", {**a, **ACTION},
                       {"tenant": "team-a", "name": "x", "scope": "cluster-admin"})
    assert status == 403 and "you need a cluster-admin key" in body, body  # no climbing
    assert {k["tenant"] for k in json.loads(dev.run("keys", "list", "--json"))} == {"team-a", "default"}
    # in its own tenant it may: the rule is the tenant, not a blanket refusal
    status, body = ask(port, "POST", "/console/keys/create", {**a, **ACTION}, {"tenant": "team-a", "name": "ci"})
    assert status == 200 and json.loads(body)["key"].startswith("gpuflow-"), body
    status, body = ask(port, "POST", "/console/deployments/a-chat/scale", {**a, **ACTION}, {"replicas": 0})
    assert status == 200, body
    until("a-chat scaled to 0", lambda: dev.status("a-chat")["deployments"][0]["replicas"] == 0, timeout=30)
    assert ask(port, "POST", "/console/hosts/box/cordon", {**a, **ACTION}, {"on": True})[0] == 403  # every tenant's
    # a cluster-admin may, and a keyed console still answers only to its own names
    root = {**keyed["root"], **ACTION}
    assert ask(port, "POST", "/console/deployments/b-chat/scale", root, {"replicas": 1})[0] == 200
    assert ask(port, "GET", "/console/", {**keyed["root"], "Host": f"evil.example:{port}"})[0] == 421


def test_the_cli_refuses_a_key_it_cannot_make(dev, keyed):
    out = dev.run("keys", "create", "--tenant", "nope", code=2)
    assert "tenant 'nope' is not in the tenants file (known: default, team-a, team-b)" in out, out
    assert "invalid choice: 'root'" in dev.run("keys", "create", "--tenant", "team-a", "--scope", "root", code=2)
    assert "not allowed with argument" in dev.run("keys", "create", "--tenant", "team-a", "--admin", "--scope",
                                                  "metrics", code=2)


def test_a_raw_update_is_refused_naming_the_field(dev, keyed):
    """What ``temporal workflow update`` sends: values that are not exactly a boolean, an enum or a
    whole number, refused by the validators before anything enters a history."""
    good = {"id": "0123456789ab", "tenant": "team-a", "salt": "0" * 32, "hash": "0" * 64}

    async def go():
        client = await connect(TemporalSettings(address=dev.address), wait_s=20)
        refused = []
        for wid, update, arg in [
            (CLUSTER_ID, CLUSTER_CREATE_KEY, {**good, "admin": "yes"}),
            (CLUSTER_ID, CLUSTER_CREATE_KEY, {**good, "admin": 1}),
            (CLUSTER_ID, CLUSTER_CREATE_KEY, {**good, "scope": "root"}),
            (deployment_id("a-chat"), DEPLOYMENT_SCALE, True),
            (deployment_id("a-chat"), DEPLOYMENT_SCALE, "3"),
        ]:
            with pytest.raises(WorkflowUpdateFailedError) as e:
                await client.get_workflow_handle(wid).execute_update(update, arg)
            refused.append(str(e.value.cause))
        with pytest.raises(WorkflowUpdateFailedError) as e:  # a valid key for a tenant that does not exist
            await client.get_workflow_handle(CLUSTER_ID).execute_update(CLUSTER_CREATE_KEY, {**good, "tenant": "ghost"})
        return refused, str(e.value.cause)
    refused, ghost = asyncio.run(go())
    assert all("admin: Input should be a valid boolean" in r for r in refused[:2])  # "yes", 1
    assert "scope: Input should be 'tenant', 'tenant-admin', 'cluster-admin' or 'metrics'" in refused[2]
    assert "scale takes one whole number of replicas" in refused[3] and "'True' (bool)" in refused[3]
    assert "'3' (str)" in refused[4]
    assert "tenant 'ghost' is not in the tenants file (known: default, team-a, team-b)" in ghost, ghost
    assert "0123456789ab" not in dev.run("keys", "list", "--json")


def test_metrics_need_a_metrics_or_cluster_admin_key_and_a_huge_usage_stops_no_count(sqlite_store, procs, tmp_path):
    url, schema, engine = sqlite_store
    huge, fine = gs.engine("huge", mode="huge-usage"), gs.engine("fine")
    procs += [huge, fine]
    for name, e in (("big", huge), ("chat", fine)):
        gs.deploy(engine, name, tenant="team-a")
        gs.running(engine, f"{name}-0", name, e.port)
    tenant_key, t = keys.create(engine, "team-a")
    other_key, o = keys.create(engine, "team-a")
    metrics_key, _ = keys.create(engine, "default", scope="metrics")
    root_key, _ = keys.create(engine, "default", scope="cluster-admin")
    g = gs.gateway(url, schema, "--metrics-key-required", log=str(tmp_path / "gw.log"))
    procs.append(g)
    base = f"http://127.0.0.1:{g.port}"
    gs.wait_model(base, "chat", 1, headers={"Authorization": f"Bearer {tenant_key}"}, every=0.3)

    def get(path: str, key: str) -> tuple[int, str]:
        return ask(g.port, "GET", path, {"Authorization": f"Bearer {key}"})
    status, body = get("/metrics", tenant_key)
    assert status == 403, (status, body)  # M6: before, 200 and every tenant's series
    err = json.loads(body)["error"]
    assert err["type"] == "permission_error" and "needs a cluster-admin or metrics key" in err["message"]
    assert get("/metrics", metrics_key)[0] == 200 and get("/metrics", root_key)[0] == 200
    assert get("/metrics", "gpuflow-000000000000-" + "x" * 43)[0] == 401
    status, body = get("/v1/models", metrics_key)
    assert status == 403 and "reads /metrics only" in body  # a metrics key serves nothing else

    # M5: the huge engine answers t's key; o's key uses the other. Before, the first flush after the
    # huge answer failed, and every one after it: o's counts never reached the store.
    with openai.OpenAI(base_url=f"{base}/v1", api_key=tenant_key, max_retries=0) as ct, \
            openai.OpenAI(base_url=f"{base}/v1", api_key=other_key, max_retries=0) as co:
        assert ct.chat.completions.create(model="big", messages=[{"role": "user", "content": "x"}],
                                          max_tokens=2).usage.prompt_tokens == 2**70  # the client gets it as sent
        time.sleep(0.1)
        co.chat.completions.create(model="chat", messages=[{"role": "user", "content": "x"}], max_tokens=3)

    def counted():
        now = time.time()
        return key_usage.totals(engine, now - 3600, now).by_key
    # o: 1 request, prompt len('[{"role": "user", "content": "x"}]') // 4 + 1 = 34 // 4 + 1 = 9, completion 3
    # t: 1 request, prompt 2**70 clipped to one answer's most, 2**32; completion 2
    want = {o.id: Counts(1, 9, 3), t.id: Counts(1, 2**32, 2)}
    gs.wait_for(lambda: counted() == want, 20, f"both keys' usage flushed (every 5 s): {want}", 0.5)
    with open(tmp_path / "gw.log") as f:
        assert "cannot write per-key usage" not in f.read()
