"""The gateway's overhead, measured (prints figures, asserts nothing).

Two stand-in engines (tests/standin_engine.py, a fixed time per token) serve one deployment.
The same load goes once straight at the replicas (round robin) and once through a real
``gpuflow gateway`` process, for each HTTP client the gateway can use (aiohttp, httpx): 64
concurrent streams of TOKENS tokens, then 64 concurrent plain requests of one token, in
ROUNDS interleaved rounds of SECONDS per path (a busy moment on a shared machine then hits every
path alike). Printed: requests/s, the ratio to direct, the added p50/p99 latency, and the CPU
the gateway process spent per request: the figure that depends least on how busy the machine
is (on a CPU-bound machine every hop's CPU comes out of the cores the engines need too), and
how long the gateway's threads waited for a CPU per second they ran (``gw wait/run``: above
about 1 the machine, not the gateway, sets the pace).

    make bench-gateway   # or: .venv/bin/python bench/bench_gateway.py [--seconds 3] [--rounds 3]
                         #      [--token-ms 25] [--tokens 16]"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

import aiohttp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from store import db  # noqa: E402
from tests import gateway_stack as gs  # noqa: E402

CONCURRENCY = 64


async def load(urls: list[str], stream: bool, tokens: int, seconds: float) -> tuple[int, list[float], int]:
    """(requests done, their latencies in s, failures) of CONCURRENCY clients for ``seconds``."""
    body = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens, "stream": stream}
    lat: list[float] = []
    failed = 0
    end = time.perf_counter() + seconds
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:
        async def client(i: int) -> None:
            nonlocal failed
            n = i
            while time.perf_counter() < end:
                url = urls[n % len(urls)]
                n += 1
                t = time.perf_counter()
                async with session.post(url, json=body) as r:
                    async for _ in r.content.iter_any():
                        pass
                    if r.status != 200:
                        failed += 1
                        continue
                lat.append(time.perf_counter() - t)

        await asyncio.gather(*(client(i) for i in range(CONCURRENCY)))
    return len(lat), lat, failed


def cpu_s(pid: int) -> float:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def cpu_wait_s(pid: int) -> float:
    """Seconds the process's threads spent runnable but waiting for a CPU (/proc schedstat)."""
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{t}/schedstat") as f:
            total += int(f.read().split()[1])
    return total / 1e9


def pct(xs: list[float], p: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[p - 1] if len(xs) > 1 else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0, help="per path and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--token-ms", type=float, default=25.0, help="time per token (default 25: 40 tokens/s a stream)")
    ap.add_argument("--tokens", type=int, default=16, help="tokens per stream")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-gw-")
    url = db.sqlite_url(os.path.join(tmp, "gpuflow.db"))
    store = db.make_engine(url)
    db.init_db(store)
    engines = [gs.engine(f"r{i}", token_s=a.token_ms / 1000) for i in range(2)]
    gs.deploy(store, "bench", max_concurrency=CONCURRENCY)
    for i, e in enumerate(engines):
        gs.running(store, f"bench-{i}", "bench", e.port)
    path = "/v1/chat/completions"
    targets = {"direct": [f"http://127.0.0.1:{e.port}{path}" for e in engines]}
    pids: dict[str, int] = {}
    gateways = []
    try:
        for kind in ("aiohttp", "httpx"):
            g = gs.gateway(url, None, "--http-client", kind, log=os.path.join(tmp, f"gateway-{kind}.log"))
            gateways.append(g)
            gs.wait_model(f"http://127.0.0.1:{g.port}", "bench", 2)
            targets[f"gateway ({kind})"] = [f"http://127.0.0.1:{g.port}{path}"]
            pids[f"gateway ({kind})"] = g.p.pid
        print(f"2 stand-in replicas, {a.token_ms:g} ms per token; {CONCURRENCY} concurrent clients; "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
        for label, stream, tokens in (("streams", True, a.tokens), ("plain, 1 token", False, 1)):
            print(f"\n{label} ({tokens} token(s) each; {a.rounds} interleaved rounds of {a.seconds:g} s per path)")
            print(f"{'path':<20}{'req/s':>9}{'ratio':>8}{'p50 ms':>9}{'p99 ms':>9}{'+p50 ms':>9}{'+p99 ms':>9}"
                  f"{'failed':>8}{'gw CPU ms/req':>15}{'gw wait/run':>13}")
            done = {name: [0, [], 0, 0.0, 0.0] for name in targets}  # requests, latencies, failures, CPU s, wait s
            for name, urls in targets.items():
                asyncio.run(load(urls, stream, tokens, 1.0))  # warm the pools
            for _ in range(a.rounds):  # interleaved, so that a busy moment on the machine hits every path
                for name, urls in targets.items():
                    pid = pids.get(name)
                    c0, w0 = (cpu_s(pid), cpu_wait_s(pid)) if pid else (0.0, 0.0)
                    n, lat, failed = asyncio.run(load(urls, stream, tokens, a.seconds))
                    d = done[name]
                    d[0], d[2] = d[0] + n, d[2] + failed
                    if pid:
                        d[3], d[4] = d[3] + cpu_s(pid) - c0, d[4] + cpu_wait_s(pid) - w0
                    d[1].extend(lat)
            base = None
            for name, (n, lat, failed, cpu, wait) in done.items():
                rps, p50, p99 = n / (a.seconds * a.rounds), pct(lat, 50) * 1000, pct(lat, 99) * 1000
                base = base or (rps, p50, p99)
                per = f"{cpu * 1000 / max(n, 1):.2f}" if name in pids else "-"
                ratio = f"{wait / max(cpu, 1e-9):.1f}" if name in pids else "-"
                print(f"{name:<20}{rps:>9.1f}{rps / base[0]:>8.2f}{p50:>9.2f}{p99:>9.2f}"
                      f"{p50 - base[1]:>9.2f}{p99 - base[2]:>9.2f}{failed:>8}{per:>15}{ratio:>13}")
    finally:
        for p in gateways + engines:
            p.stop()


if __name__ == "__main__":
    main()
