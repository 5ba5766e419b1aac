"""Prefill/decode disaggregation against aggregated serving on the same GPUs (prints figures,
asserts nothing; issue 35).

Stand-in engines on simulated GPUs (``gpuflow standin --sim-gpu`` or ``--pd-role prefill|decode``,
gpuflow/demo/standin_pd.py: one GPU a process, continuous batching, a step is one prefill chunk or
one decode step for every running sequence) serve, through one real ``gpuflow gateway`` over a
real store, the same GPUs arranged as N aggregated replicas (a plain deployment), as 1P1D and as
the other prefill:decode ratios of N (a group, mode custom, no router: the gateway pairs them).
The workload: long prompts (``--prompt-tokens``, each one unique), streamed with the ``openai``
client (``ignore_eos``: ``--max-tokens`` each), ``--clients`` a GPU at once back to back, every
arrangement for ``--seconds`` a round, the arrangements interleaved over ``--rounds`` rounds (a
busy moment on the machine hits each alike). Printed per arrangement: completed requests/s, TTFT
p50/p90, ITL p50/p99 (each gap between two streamed tokens, measured by the client), the share of
answers decoded from a prefill's KV (the answer's ``gpuflow_kv``), failures, and the gateway
process's CPU per request.

    make bench-pd   # or: .venv/bin/python bench/bench_pd.py [--gpus 2,4] [--seconds 20] [--rounds 2]
                    #      [--prompt-tokens 6000] [--max-tokens 96] [--clients 2] [--token-ms 20]
                    #      [--prefill-us 100] [--kv-us 5]"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time

import openai
from sqlmodel import Session

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_gateway import cpu_s, pct  # noqa: E402
from store import db  # noqa: E402
from store.tables import InstanceRow  # noqa: E402
from tests import gateway_stack as gs  # noqa: E402
from tests import pd_stack  # noqa: E402

WORDS = ("the sea is wide and the ships on it are small against the long grey line of the "
         "morning").split()


def prompt(i: int, tokens: int) -> list[dict]:
    """A unique prompt of about ``tokens`` tokens as the stand-in counts them (JSON characters / 4)."""
    rnd = random.Random(i)
    text, n = [f"request {i}:"], 40
    while n < tokens * 4:
        w = rnd.choice(WORDS)
        text.append(w)
        n += len(w) + 1
    return [{"role": "user", "content": " ".join(text)}]


def member_row(store, deployment: str, name: str, role: str | None, port: int, worker: str) -> None:
    """The RUNNING row the control plane would write (a group member's role and generation too)."""
    with Session(store) as s:
        r = InstanceRow(name=name, deployment=deployment)
        r.model, r.state, r.wanted, r.worker, r.address, r.port = deployment, "running", True, worker, "127.0.0.1", port
        if role:
            r.role, r.group_name, r.group_gen = role, deployment, 0
        s.add(r)
        s.commit()


def arrangements(gpus: list[int]) -> list[tuple[str, int, int]]:
    """(name, GPUs, prefills) of each arrangement of each count of GPUs: 0 prefills is aggregated."""
    return [(f"aggregated x{n}" if p == 0 else f"{p}P{n - p}D", n, p) for n in gpus for p in range(n)]


def start(a, tmp: str, store) -> tuple[dict[str, str], list]:
    """Every arrangement's engines and rows: {arrangement: its deployment (model) name}, the processes."""
    flags = {"token_s": a.token_ms / 1000, "prefill_token_s": a.prefill_us / 1e6, "kv_token_s": a.kv_us / 1e6}
    models, procs = {}, []
    for k, (name, gpus, prefills) in enumerate(arrangements(a.gpus)):
        dep = f"arr{k}"
        models[name] = (dep, gpus)
        if prefills:
            gs.deploy(store, dep, max_concurrency=64, disaggregation={"mode": "custom"},
                      roles=[{"name": "prefill", "replicas": prefills}, {"name": "decode", "replicas": gpus - prefills}])
        else:
            gs.deploy(store, dep, max_concurrency=64)
        for g in range(gpus):
            role = None if not prefills else ("prefill" if g < prefills else "decode")
            p = pd_stack.standin(role, name=dep, log=os.path.join(tmp, f"{dep}-{g}.log"), **flags)
            procs.append(p)
            member_row(store, dep, f"{dep}-{g}", role, p.port, f"w{g}")  # one host a GPU
    return models, procs


async def one(c: openai.AsyncOpenAI, model: str, i: int, a) -> tuple[float, list[float], bool]:
    """One streamed request: (TTFT s, its inter-token gaps, decoded from a prefill's KV)."""
    t0 = time.perf_counter()
    first = last = None
    gaps, kv = [], {}
    stream = await c.chat.completions.create(model=model, messages=prompt(i, a.prompt_tokens), stream=True,
                                             max_tokens=a.max_tokens, extra_body={"ignore_eos": True})
    async for ch in stream:
        kv = (ch.model_extra or {}).get("gpuflow_kv") or kv
        if ch.choices and ch.choices[0].delta.content:
            now = time.perf_counter()
            if last is not None:
                gaps.append(now - last)
            first, last = first or now, now
    if first is None:
        raise RuntimeError("no token")
    return first - t0, gaps, kv.get("source") == "remote"


async def load(base: str, model: str, a, clients: int, seconds: float, seed: int) -> dict:
    """``clients`` clients back to back for ``seconds``: what they measured."""
    out = {"ttft": [], "itl": [], "remote": 0, "done": 0, "failed": 0, "errors": []}
    end = time.perf_counter() + seconds
    async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=120) as c:
        async def client(k: int) -> None:
            i = 0
            while time.perf_counter() < end:
                i += 1
                try:
                    ttft, gaps, remote = await one(c, model, seed + k * 100_000 + i, a)
                except Exception as e:  # noqa: BLE001  a failure is a figure here
                    out["failed"] += 1
                    out["errors"].append(repr(e)[:200])
                    continue
                out["ttft"].append(ttft)
                out["itl"] += gaps
                out["remote"] += remote
                out["done"] += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(client(k) for k in range(clients)))
        out["elapsed"] = time.perf_counter() - t0
    return out


def run(a) -> None:
    tmp = tempfile.mkdtemp(prefix="bench-pd-")
    url = db.sqlite_url(os.path.join(tmp, "gpuflow.db"))
    store = db.make_engine(url)
    db.init_db(store)
    models, procs = start(a, tmp, store)
    try:
        g = gs.gateway(url, None, log=os.path.join(tmp, "gateway.log"))
        procs.append(g)
        base = f"http://127.0.0.1:{g.port}"
        for model, gpus in models.values():
            gs.wait_model(base, model, gpus, timeout=60)
            asyncio.run(load(base, model, a, 2, 0.5, 0))  # warm: the gateway's pools, the engines' first answers
        print(f"simulated GPUs: {a.gpus}; prompts of ~{a.prompt_tokens} tokens, {a.max_tokens} streamed tokens each, "
              f"{a.clients or 2} clients a GPU; prefill {a.prefill_us:g} us a token (chunks of 2048), decode step "
              f"{a.token_ms:g} ms, KV pull {a.kv_us:g} us a token; {a.rounds} interleaved rounds of {a.seconds:g} s; "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
        got = {name: {"ttft": [], "itl": [], "remote": 0, "done": 0, "failed": 0, "errors": [], "elapsed": 0.0,
                      "cpu": 0.0} for name in models}
        for r in range(a.rounds):
            for name, (model, gpus) in models.items():
                c0 = cpu_s(g.p.pid)
                o = asyncio.run(load(base, model, a, (a.clients or 2) * gpus, a.seconds, 10_000_000 * (r + 1)))
                d = got[name]
                d["cpu"] += cpu_s(g.p.pid) - c0
                for k in ("ttft", "itl", "errors"):
                    d[k] += o[k]
                for k in ("remote", "done", "failed", "elapsed"):
                    d[k] += o[k]
        report(got, a)
    finally:
        for p in reversed(procs):
            p.stop()


def report(got: dict, a) -> None:
    print(f"\n{'arrangement':<16}{'done':>6}{'req/s':>8}{'TTFT p50':>10}{'TTFT p90':>10}{'ITL p50':>9}{'ITL p99':>9}"
          f"{'disagg':>8}{'failed':>8}{'gw CPU ms/req':>15}")
    for name, d in got.items():
        n = max(d["done"], 1)
        print(f"{name:<16}{d['done']:>6}{d['done'] / max(d['elapsed'], 1e-9):>8.2f}"
              f"{pct(d['ttft'], 50) * 1000:>10.0f}{pct(d['ttft'], 90) * 1000:>10.0f}"
              f"{pct(d['itl'], 50) * 1000:>9.1f}{pct(d['itl'], 99) * 1000:>9.1f}"
              f"{d['remote'] / n:>8.0%}{d['failed']:>8}{d['cpu'] * 1000 / (d['done'] + d['failed'] or 1):>15.2f}")
    for name, gpus, prefills in arrangements(a.gpus):
        agg = f"aggregated x{gpus}"
        if prefills:
            print(f"ITL p99, {agg} / {name}: {pct(got[agg]['itl'], 99) / pct(got[name]['itl'], 99):.1f}x")
    errors = [e for d in got.values() for e in d["errors"]]
    if errors:
        print("first failures:", json.dumps(sorted(set(errors))[:5], indent=1))
    print("(ms; ITL: every gap between two streamed tokens; disagg: answers decoded from a prefill's KV)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", default="2,4", help="simulated GPUs of the arrangements, a list (default 2,4: "
                                                  "aggregated x2, 1P1D; aggregated x4, 1P3D, 2P2D, 3P1D)")
    ap.add_argument("--seconds", type=float, default=20.0, help="per arrangement and round (default 20)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=6000, help="a prompt's tokens, about (default 6000)")
    ap.add_argument("--max-tokens", type=int, default=96, help="tokens a streamed answer (default 96)")
    ap.add_argument("--clients", type=int, help="concurrent clients a GPU (default 2)")
    ap.add_argument("--token-ms", type=float, default=20.0, help="a decode step, ms (default 20)")
    ap.add_argument("--prefill-us", type=float, default=100.0, help="a prompt token's prefill, us (default 100)")
    ap.add_argument("--kv-us", type=float, default=5.0, help="a token's KV pull, us (default 5: 30 ms for 6000)")
    a = ap.parse_args()
    a.gpus = sorted({max(2, int(x)) for x in a.gpus.split(",")})
    run(a)


if __name__ == "__main__":
    main()
