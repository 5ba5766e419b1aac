"""Engines behind a key (issue 40): how each engine gets its replica's key (never in an argv, a log or
a workflow's history), what the agent's pid file keeps for an adopted process, the same key made by
the store from the launch's nonce and the host's credential, and which of a client's headers reach
an engine (an allowlist: the engine key does, a Cookie, an invented header and the client's
Authorization never)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from sqlmodel import Session

from contracts import credential as cr, launch_proof
from contracts.agent import LaunchRequest, LaunchResult
from contracts.control import InstanceRecord
from gateway.upstream import request_headers, to_engine
from store import db, host_credentials, records, serving
from store.tables import ReservationRow
from store.engine_keys import engine_keys
from worker_agent.credential import HostCredential
from worker_agent.engine_key import key_env, new_nonce, sglang_config, write_secret
from worker_agent.engines import EngineConfig, argv_for
from worker_agent.processes import ProcessTable

EXES = EngineConfig(allow_custom=True, vllm="/bin/true", sglang_python="/bin/true", llama_server="/bin/true")
HOST = bytes(range(32, 64))  # host h1's X25519 private key, fixed for the test


def credential(cluster: str = cr.public_of(bytes(range(32)))) -> HostCredential:
    """Host h1's credential, as its agent holds it after joining the cluster whose public key is
    ``cluster`` (worker_agent/credential.py)."""
    return HostCredential(name="h1", public=cr.public_of(HOST), key=cr.host_key(HOST, cluster), proof="",
                          cluster=cluster)


def req(backend: str, **kw) -> LaunchRequest:
    return LaunchRequest(instance="m-0", model="m", backend=backend, model_path="/models/m", gpu_indexes=[0], **kw)


KEY = credential().engine_key("m-0", "", "n" * 24)


@pytest.mark.parametrize("r,cfg,env", [
    (req("vllm"), EXES, {"VLLM_API_KEY": KEY}),  # vllm/envs.py
    (req("llama.cpp"), EXES, {"LLAMA_API_KEY": KEY}),  # llama-server: common/arg.cpp --api-key set_env
    (req("llama.cpp"), EngineConfig(llama_cpp_python="/bin/true"), {"API_KEY": KEY}),  # llama-cpp-python settings
    (req("sglang"), EXES, {}),  # SGLang 0.5.3 reads no variable: a --config file
    (req("custom", run_command="srv --port {port}"), EXES, {"GPUFLOW_ENGINE_API_KEY": KEY}),
    (req("custom", role="rpc-server", part="rpc0"), EXES, {}),  # helpers serve no HTTP: no key
])
def test_each_engine_gets_its_key_off_its_argv(r, cfg, env):
    argv = argv_for(r, 8000, cfg, "10.0.0.2", api_key=KEY, key_file="/run/m-0.key.yaml") if r.role == "server" \
        else []
    assert key_env(r, bool(cfg.llama_cpp_python), KEY) == env
    assert not any(KEY in w for w in argv)  # /proc/PID/cmdline is readable by every local user
    if r.backend == "sglang":
        assert argv[argv.index("--config") + 1] == "/run/m-0.key.yaml"
    assert key_env(r, bool(cfg.llama_cpp_python), None) == {}  # no credential: no key


def test_sglang_reads_its_key_from_a_file_only_its_user_reads(tmp_path):
    """SGLang's --config YAML (server_args_config_parser.py turns 'api-key: K' into --api-key K)."""
    table = ProcessTable(str(tmp_path))
    path = table.secret_path("m-0")
    write_secret(path, sglang_config(KEY))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    import yaml

    assert yaml.safe_load(open(path)) == {"api-key": KEY}
    table.forget("m-0")  # the process is gone: so is its key's file
    assert not os.path.exists(path)


def test_a_custom_commands_key_is_in_its_argv_only_and_the_pid_file_keeps_the_nonce(tmp_path):
    """``{api_key}`` is substituted in the argv the process runs; its log line and its record (whose
    argv a LaunchResult carries into the workflow's history) show the placeholder. A restarted
    agent's table reads the nonce back, so an adopted process keeps its key."""
    nonce = new_nonce()
    key = credential().engine_key("m-0", "", nonce)
    argv = argv_for(req("custom", run_command="python3 -c 'import time; time.sleep(30)' --key={api_key}"), 8000,
                    EXES, api_key=key)
    assert argv[-1] == f"--key={key}"
    table = ProcessTable(str(tmp_path))
    rec = table.start("m-0", argv, {"GPUFLOW_ENGINE_API_KEY": key}, 8000, key_id=nonce, secret=key)
    try:
        assert rec.argv[-1] == "--key={api_key}" and rec.key_id == nonce
        with open(table.log_path("m-0")) as f:
            assert key not in f.read()
        with open(os.path.join(table.run_dir, "m-0.json")) as f:
            assert key not in f.read()
        again = ProcessTable(str(tmp_path)).find("m-0")  # the next agent run
        assert again.key_id == nonce and again.pid == rec.pid
        assert LaunchResult(pid=rec.pid, argv=rec.argv, key_id=again.key_id).key_id == nonce
    finally:
        table.signal_group(rec.pid, 9)


@pytest.mark.parametrize("key_id", ["short", "a" * 65, "has space" + "x" * 20, "../../../../etc/passwd-xxxxx"])
def test_a_nonce_from_temporal_is_bounded(key_id):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="key_id"):
        LaunchResult(pid=1, key_id=key_id)


@pytest.fixture
def store(tmp_path):
    engine = db.make_engine(db.sqlite_url(str(tmp_path / "gpuflow.db")))
    db.init_db(engine)
    yield engine
    engine.dispose()


def joined(store, host: str = "h1") -> HostCredential:
    """Host h1 joined the store's cluster with HOST's public key; its agent's credential."""
    cluster = host_credentials.ensure_cluster(store)
    assert host_credentials.accept(store, host, cr.public_of(HOST))
    return credential(cluster.public)


def rec(name: str, worker: str | None, key_id: str | None, state: str = "running") -> InstanceRecord:
    return InstanceRecord(name=name, deployment="m", model="m", state=state, worker=worker, port=8000,
                           address="127.0.0.1", key_id=key_id)


def test_the_store_makes_the_key_the_agent_made_from_the_nonce_alone(store):
    """The agent's key (its host key: X25519 with the cluster's public key) equals the store's (the
    cluster's private key with the host's public key), from the nonce that crossed Temporal."""
    agent = joined(store)
    nonce = new_nonce()
    with Session(store) as s:  # the ledger books m-0 on h1, and h1's agent proved the launch (its MAC)
        s.add(ReservationRow(instance="m-0", worker="h1", gpu_index=0, vram=2**30))
        s.commit()
    fields = launch_proof.body("m-0", "", None, 8000, "127.0.0.1", nonce, None)
    records.record_instance(store, rec("m-0", "h1", nonce).model_copy(
        update={"launch_mac": launch_proof.sign(agent.key, "h1", fields)}))
    [route] = serving.routes(store)
    assert route.engine_key == agent.engine_key("m-0", "", nonce)
    assert route.engine_key not in repr(route)  # never in a log line that prints a route
    records.record_instance(store, rec("m-0", "h1", None, state="stopping"))  # stopped: its key goes with it
    assert serving.routes(store) == []


@pytest.mark.parametrize("worker,key_id,why", [
    ("h2", "n" * 24, "a host that never joined (or was forgotten): the control plane cannot vouch for it"),
    ("h1", None, "no nonce: a launch by an agent without a credential"),
    (None, "n" * 24, "no host"),
])
def test_no_key_without_a_joined_host_and_a_nonce(store, worker, key_id, why):
    joined(store)
    assert engine_keys(store, [rec("m-0", worker, key_id)]) == {}, why


def test_a_forgotten_host_s_replicas_lose_their_key(store):
    joined(store)
    assert engine_keys(store, [rec("m-0", "h1", "n" * 24)])
    host_credentials.forget(store, "h1")
    assert engine_keys(store, [rec("m-0", "h1", "n" * 24)]) == {}


# (a client's header, whether an engine sees it)
HEADERS = [
    (b"content-type", True),  # the body's type
    (b"accept", True),  # JSON or an event stream
    (b"cookie", False),  # the console's session
    (b"authorization", False),  # the client's gpuflow key: never the engine's
    (b"x-invented", False),  # anything a client makes up
    (b"x-request-id", False),  # vLLM's own id for the request, shared by every tenant on the replica
    (b"accept-encoding", False),  # the gateway reads answers (usage, stream timing): they come back as sent
    (b"user-agent", False),
    (b"host", False), (b"content-length", False), (b"connection", False),  # the client to the gateway's own
]


def test_only_allowed_headers_reach_an_engine_and_the_engine_key_does():
    raw = [(k, b"from-the-client") for k, _ in HEADERS]
    sent = to_engine(request_headers(raw), "gfe-the-engine-key")
    assert {k for k in sent if k != "authorization"} == {k.decode() for k, seen in HEADERS if seen}
    assert sent["authorization"] == "Bearer gfe-the-engine-key"  # the engine's key, not the client's
    assert "authorization" not in to_engine(request_headers(raw), None)  # a replica without a key: none sent
    assert request_headers([(b"Content-Type", b"application/json")]) == {"content-type": "application/json"}


def test_what_crosses_temporal_names_no_key():
    """The nonce and the record's fields: no field holds a key (a key begins 'gfe-')."""
    nonce = new_nonce()
    blob = json.dumps([LaunchResult(pid=1, key_id=nonce).model_dump(), rec("m-0", "h1", nonce).model_dump()])
    assert cr.ENGINE_KEY_PREFIX not in blob


def test_what_is_read_of_a_log_shows_no_engine_key(tmp_path):
    """SGLang logs its ServerArgs at start, api_key included; a custom command may echo its key. A
    log read in chunks of any size (``gpuflow logs``), from the end, or as a failed start's last
    lines (LaunchFailed's message, kept in the workflow's history) shows it starred, same length."""
    from contracts.agent import LogRequest
    from worker_agent.log_reader import read_chunk

    table = ProcessTable(str(tmp_path))
    line = f"INFO server_args=ServerArgs(model_path='/m', api_key='{KEY}', port=30000)\n"
    text = f"--- gpuflow: starting sglang\n{line}boom\n"
    with open(table.log_path("m-0"), "w") as f:
        f.write(text)
    starred = text.replace(KEY, "gfe-" + "*" * 43)
    assert KEY[4:] not in table.tail("m-0") and "gfe-" + "*" * 43 in table.tail("m-0")
    for size in (1, 5, 46, 47, 48, 100):  # every chunk size, so a key is cut at every place
        got, offset = "", 0
        while offset < len(text):
            chunk = read_chunk(table.log_dir, LogRequest(instance="m-0", worker="h1", offset=offset, max_bytes=size))
            got, offset = got + chunk.text, chunk.offset
        assert got == starred, size
    for back in range(1, len(text)):  # from the end, as 'gpuflow logs' starts
        assert KEY[4:20] not in read_chunk(table.log_dir, LogRequest(instance="m-0", worker="h1", offset=-back)).text


def test_a_key_being_written_is_not_shown_until_whole(tmp_path):
    from contracts.agent import LogRequest
    from worker_agent.log_reader import read_chunk

    table = ProcessTable(str(tmp_path))
    with open(table.log_path("m-0"), "w") as f:
        f.write(f"key: {KEY[:30]}")  # the engine is still writing it
    first = read_chunk(table.log_dir, LogRequest(instance="m-0", worker="h1", offset=0))
    assert first.text == "key: " and first.offset == 5  # held back, and read again next time
    with open(table.log_path("m-0"), "a") as f:
        f.write(f"{KEY[30:]}\n")
    assert read_chunk(table.log_dir, LogRequest(instance="m-0", worker="h1", offset=first.offset)).text == \
        "gfe-" + "*" * 43 + "\n"


def test_the_demos_toy_engine_answers_only_its_key_and_serves_no_file(tmp_path):
    """gpuflow/demo/toy_server.py replaced 'python3 -m http.server', which listed and served the
    agent's working folder to anyone on the port; its name now starts the stand-in engine
    (gpuflow/demo/standin.py)."""
    import subprocess
    import sys

    import httpx2 as httpx

    from gpuflow.ports import server_port
    from tests.gateway_stack import wait_port

    port = server_port()
    (tmp_path / "secret.txt").write_text("s3cr3t")
    p = subprocess.Popen([sys.executable, "-m", "gpuflow.demo.toy_server", "--port", str(port)], cwd=tmp_path,
                         env={**os.environ, "GPUFLOW_ENGINE_API_KEY": KEY})
    try:
        wait_port(port, p)
        base, ok = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {KEY}"}
        assert httpx.get(f"{base}/health").status_code == 200  # the probes' path
        assert [httpx.get(f"{base}/").status_code, httpx.get(f"{base}/", headers=ok).status_code] == [401, 200]
        assert httpx.get(f"{base}/", headers={"Authorization": "Bearer gfe-wrong"}).status_code == 401
        got = httpx.get(f"{base}/secret.txt", headers=ok)
        assert got.status_code == 404 and b"s3cr3t" not in got.content
    finally:
        p.terminate()
        p.wait(10)
