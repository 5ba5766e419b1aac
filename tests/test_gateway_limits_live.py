"""Limits held across gateways and per key, live (issue 38): two real ``gpuflow gateway``
processes over one store, in front of a stand-in engine, asked by the official ``openai`` client
through both at once.

- tenant ``team`` (``requests_per_s: 4``): 8 callers, 4 on each gateway, for 10 s. Each gateway
  alone would admit 4 a second (80 together, as before this change); together they admit
  4 * 10 plus their buckets' start and the share's lag (README: at most about 4 * 10 + 6);
- a key made with ``gpuflow keys create --requests-per-s 1``: its own limit holds across both
  gateways while its tenant has room, and its 429 says ``scope=key``; ``gpuflow keys edit`` clears it."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import openai

from store import keys
from tests import gateway_stack as gs
from tests.gateway_stack import procs, sqlite_store  # noqa: F401  (fixtures)

MSG = [{"role": "user", "content": "hi"}]
TENANTS = "tenants:\n  - {name: team, requests_per_s: 4}\n"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuflow", *args], capture_output=True, text=True, timeout=120)


def hammer(ports: list[int], key: str, callers_each: int, seconds: float) -> tuple[list[tuple[int, float]], list]:
    """``callers_each`` callers on each gateway for ``seconds``: (admitted (port, when), 429s' (header, error))."""
    ok, refused, lock = [], [], threading.Lock()
    end = time.monotonic() + seconds

    def caller(port: int):
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=30)
        while time.monotonic() < end:
            try:
                c.chat.completions.create(model="chat", messages=MSG, max_tokens=1)
                with lock:
                    ok.append((port, time.monotonic()))
            except openai.RateLimitError as e:
                with lock:
                    refused.append((e.response.headers.get("x-gpuflow-limit"), e.response.json()["error"]))
                time.sleep(0.02)

    threads = [threading.Thread(target=caller, args=(p,)) for p in ports for _ in range(callers_each)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ok, refused


def test_two_gateways_hold_a_tenants_requests_per_s_and_a_keys_own(sqlite_store, procs, tmp_path):
    url, schema, engine = sqlite_store
    e = gs.engine("r1", token_s=0.001)
    procs.append(e)
    gs.deploy(engine, "chat", max_concurrency=64)
    gs.running(engine, "chat-0", "chat", e.port)
    f = tmp_path / "tenants.yaml"
    f.write_text(TENANTS)
    done = cli("tenants", "apply", str(f), "--database-url", url)
    assert done.returncode == 0, done.stderr
    key = keys.create(engine, "team")[0]
    made = cli("keys", "create", "--tenant", "team", "--requests-per-s", "1", "--database-url", url)
    assert made.returncode == 0 and "its own limits: requests_per_s=1" in made.stdout, made.stdout + made.stderr
    slow_key = made.stdout.strip().splitlines()[1]
    gws = [gs.gateway(url, schema, log=str(tmp_path / f"gw{i}.log")) for i in (1, 2)]
    procs.extend(gws)
    auth = {"Authorization": f"Bearer {key}"}
    for g in gws:
        gs.wait_model(f"http://127.0.0.1:{g.port}", "chat", 1, headers=auth, every=0.25)
    time.sleep(1.5)  # each has read the other's row: shares of 1/2

    ok, refused = hammer([g.port for g in gws], key, 4, 10.0)
    by = {g.port: sum(1 for p, _ in ok if p == g.port) for g in gws}
    print(f"tenant team, 4 rps, 10 s through 2 gateways: admitted {len(ok)} {by}, refused {len(refused)}")
    assert 30 <= len(ok) <= 46, by  # 4 * 10 = 40, + the buckets' start (2 + 2) and a refresh's lag
    assert min(by.values()) >= 10, by  # both served their share
    assert refused and {h for h, _ in refused} == {"requests_per_s; scope=tenant"}
    err = refused[0][1]
    assert (err["code"], err["limit"], err["scope"]) == ("rate_limit_exceeded", "requests_per_s", "tenant")
    assert "requests_per_s in the tenants file" in err["message"]

    time.sleep(2.0)  # team's bucket refills (4 a second): the key's own limit (1 a second) decides now
    ok, refused = hammer([g.port for g in gws], slow_key, 1, 6.0)
    print(f"key's own 1 rps, 6 s through 2 gateways: admitted {len(ok)}, refused {len(refused)}")
    assert 3 <= len(ok) <= 10, len(ok)  # 1 * 6 + the buckets' start (1 + 1) and lag
    assert refused and {h for h, _ in refused} == {"requests_per_s; scope=key"}
    assert "gpuflow keys edit" in refused[0][1]["message"]

    kid = keys.key_id(slow_key)
    edited = cli("keys", "edit", kid, "--clear", "requests_per_s", "--max-concurrent", "3", "--database-url", url)
    assert edited.returncode == 0 and "limits: max_concurrent=3" in edited.stdout, edited.stdout + edited.stderr
    listed = json.loads(cli("keys", "list", "--json", "--database-url", url).stdout)
    mine = next(k for k in listed if k["id"] == kid)
    assert (mine["requests_per_s"], mine["max_concurrent"]) == (None, 3)
    bad = cli("keys", "edit", kid, "--requests-per-s", "-1", "--database-url", url)
    assert bad.returncode == 2 and "--requests-per-s" in bad.stderr, bad.stderr
