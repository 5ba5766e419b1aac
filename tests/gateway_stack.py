"""Real processes for the gateway's tests and bench: stand-in engines (tests/standin_engine.py,
and tests/standin_cache_engine.py with a prefix cache) and ``gpuflow gateway`` itself, over a real store whose rows are written with the store's own
functions (no Temporal: the store is all a gateway reads)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx2 as httpx

from contracts.control import InstanceRecord
from store import records
from gpuflow.ports import port_open, server_port

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not port_open("127.0.0.1", port):
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        if time.monotonic() > end:
            raise TimeoutError(f"nothing listens on {port} after {timeout} s: {proc.args}")
        time.sleep(0.05)


class Proc:
    def __init__(self, argv: list[str], port: int, log: str | None = None, env: dict | None = None):
        self.port, self.log = port, log
        out = open(log, "ab") if log else subprocess.DEVNULL
        self.p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                  env={**os.environ, **(env or {})})
        wait_port(port, self.p)

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
            self.p.wait(10)

    def stop(self) -> int:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.p.returncode


def engine(name: str, token_s: float = 0.005, mode: str = "ok", log: str | None = None) -> Proc:
    port = server_port()
    return Proc([sys.executable, os.path.join(HERE, "standin_engine.py"), "--port", str(port), "--name", name,
                 "--token-s", str(token_s), "--mode", mode], port, log)


def cache_engine(name: str, log: str | None = None, **knobs) -> Proc:
    """A stand-in with a prefix cache (tests/standin_cache_engine.py); ``knobs`` are its flags
    (block_chars, cache_blocks, prefill_block_s, token_s)."""
    port = server_port()
    flags = [x for k, v in knobs.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    return Proc([sys.executable, os.path.join(HERE, "standin_cache_engine.py"), "--port", str(port), "--name", name,
                 *flags], port, log)


def gateway(url: str, schema: str | None, *args: str, log: str | None = None) -> Proc:
    port = server_port()
    env = {"GPUFLOW_DATABASE_SCHEMA": schema} if schema else {}
    return Proc([sys.executable, "-m", "gpuflow", "gateway", "--database-url", url, "--listen", f"127.0.0.1:{port}",
                 *args], port, log, env)


def deploy(store_engine, name: str, **spec) -> None:
    records.save_deployment(store_engine, name, {"name": name, "backend": "custom", "run_command": "x", **spec}, 1)


def running(store_engine, instance: str, deployment: str, port: int, state: str = "running") -> None:
    records.record_instance(store_engine, InstanceRecord(name=instance, deployment=deployment, model=deployment,
                                                         state=state, worker="w1", port=port, address="127.0.0.1"),
                           check_launch=False)  # a fixture's row: no agent launched it (store/engine_keys.py)


def wait_for(cond, timeout: float, what: str, every: float = 0.05):
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise TimeoutError(f"{what}: not after {timeout} s")
        time.sleep(every)


def wait_model(base: str, model: str, replicas: int, timeout: float = 10.0, headers: dict | None = None,
               every: float = 0.05) -> None:
    def ok():
        r = httpx.get(f"{base}/v1/models", headers=headers or {})
        return r.status_code == 200 and any(m["id"] == model and m["replicas"] == replicas for m in r.json()["data"])
    wait_for(ok, timeout, f"{model} with {replicas} replica(s) in {base}/v1/models", every)


def metric(text: str, name: str, **labels) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``, in Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


# Fixtures the gateway tests share (imported by name into each test module).
import pytest  # noqa: E402

from store import db  # noqa: E402


@pytest.fixture
def sqlite_store(tmp_path):
    """(URL, schema, engine) of a fresh SQLite store in the test's folder."""
    url = db.sqlite_url(str(tmp_path / "gpuflow.db"))
    engine = db.make_engine(url)
    db.init_db(engine)
    yield url, None, engine
    engine.dispose()


@pytest.fixture
def procs():
    """Processes a test starts (Proc), stopped last-first when it ends."""
    started: list[Proc] = []
    yield started
    for p in reversed(started):
        p.stop()
