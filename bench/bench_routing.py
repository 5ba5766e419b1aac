"""Cache-aware routing against its baselines, through real gateways (prints figures and which of
issue 39's targets were met; asserts nothing).

Stand-in engines with a prefix cache (tests/standin_cache_engine.py: an LRU of ``--cache-blocks``
blocks of 64 characters that frees a prompt's tail first, as vLLM does; prefills one at a time at
``--prefill-ms`` per uncached block) serve one deployment. One ``gpuflow gateway`` process per
policy, all reading the same store: ``cache-aware`` and ``least-outstanding`` are the gateway's own
(``--routing``); the others are the same gateway with its choice replaced (``Baseline``):
``pinned``, the ideal (each prefix fixed to one replica: the first block's hash dealt round-robin
in order of first arrival, waiting for it whatever its load), ``sglang`` (SGLang router's rule:
shortest queue when max-min > 32 and max > 1.0001 x min, else the best match above
cache_threshold 0.5, else the smallest tree; its tree approximated by the gateway's block index,
unbounded as SGLang's is for this load, and not corrected by answers) and ``random``
(``--policies``). ``cache-aware-learned`` (``--policies``) is the cache-aware gateway told nothing of
the engines' cache (its index starts at the default 16,384 blocks, 128x theirs), and the engines
then do not report their size either (``--cache-info no``): it must learn it from their answers.

Workloads (bench/routing_workloads.py): ``shared-prefix`` (prefixes 75% of the caches),
``cache-filling`` (prefixes 90% of them, the questions the rest: pinned, each replica's cache is
full, every request evicts, and tail-first eviction decides what survives), ``inference-perf``
(inference-perf's shared-prefix generator, in its own venv, with SmolLM2's tokenizer read locally;
skipped, saying why, when that venv is missing), ``hot-prefix`` (shared-prefix's prompts with Zipf
popularity, longer questions and a higher rate: the hot customer needs about 0.9 of a replica's
prefill alone, so its replica runs ahead, and when and where to move its requests decides both
the median and the tail) and ``no-prefix``. Each phase (a policy on a
workload) starts with every engine's cache emptied and its policy's gateway started afresh (its
index and measured pace as cold as the caches: a gateway kept from the phase before believed the
engines held what they had just dropped, and a customer's first request could follow a stale entry
to a full miss beside other requests, a tail a live system does not meet), and sees the same
Poisson arrivals as the other policies; phases are interleaved over ``--rounds`` rounds, the order
reversed every other round.

Rounds: ``--seconds`` 20 of arrivals a phase, the first ``--warmup`` 4 sent but not counted (the
caches start cold: each customer's first request is a full miss under every policy, and the
prefills they queue slow the first seconds for all). Two rounds pool 32 counted seconds, 450-900
requests a workload and policy (14-28 req/s), so the p99 rests on 4-9 requests and the p90 on
45-90; each round's own p90 is printed beside the pooled one, so the swing that is left shows.
Longer rounds steady the p99 further (``--seconds 40``: about 20 minutes in all); issue 39's run
of two 12 s rounds, not pooled, swung 41/400 to 588/2,780 ms (p90/p99) from one round to the next.
The arrivals are seeded: a second run repeats the first's choices. ``--seed N`` draws others (0,
the default, draws those of every run before). Where rules tie on hits, which customers come to
share a replica decides the tail, and that is luck for customers of one rate: compare such rules
over several seeds (tests/test_cache_cost_sim.py replays cache-filling over 60).

Printed per policy: TTFT p50/p90/p99 (pooled over rounds), completed requests per second, the
share of full misses (requests answered with 0 cached tokens) and, for cache-aware, how many of
those it sent where its index believed the prefix held (``held->0``, read from the
``x-gpuflow-route`` header every request asks for), the engines' cache hit rate and its
ratio to the ideal (every request but a customer's first in a phase hits its whole shared prefix),
the load spread (requests on the busiest replica / the mean), failures, the gateway's CPU per
request, and how often the cache-aware guard sent a request off its best match. ``--slowest 0.02``
also prints each phase's slowest 2% of requests with the replica, the tokens cached and the route
header: which choices make the tail.

    make bench-routing   # or: .venv/bin/python bench/bench_routing.py [--seconds 20] [--rounds 2] ..."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import urllib.request

import aiohttp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import routing_baselines as rb  # noqa: E402
from bench import routing_report as rr  # noqa: E402
from bench import routing_workloads as rw  # noqa: E402
from bench.bench_gateway import cpu_s  # noqa: E402
from tests import gateway_stack as gs  # noqa: E402

POLICIES = ("cache-aware", "pinned", "least-outstanding", "sglang", "random", "cache-aware-learned")


def serve_gateway(policy: str, url: str, port: int, cache_chars: int) -> None:
    """Child process: a gateway whose choice of replica is ``policy`` (a baseline's replaces the
    balancer's own; the rest of the gateway is unchanged)."""
    import uvicorn

    from gateway.app import build, uvicorn_config
    from gateway.balance import Balancer
    from gateway.cache_aware import Choice, eligible
    from gateway.config import GatewaySettings
    from gateway.prefix_index import PrefixIndex
    from store import db

    class Baseline(Balancer):
        pins: dict[int, str] = {}  # pinned: a prompt's first block -> its replica

        def _choose(self, model, exclude, now, prompt):
            m = self.table.models[model]
            blocks = prompt.blocks if prompt is not None else ()
            if policy == "pinned":
                r = self._pinned(m, blocks, exclude, now)
            else:
                ok = eligible(m.replicas, m.limit, self.in_flight, self.bad_until, now, exclude)
                r = ok and self._rule(ok, blocks)
            if not r:
                return None
            self.in_flight[r.instance] = self.in_flight.get(r.instance, 0) + 1
            if prompt is not None:
                prompt.choice = Choice(r, policy, 0, len(blocks), self.in_flight[r.instance] - 1, m.limit)
            return r

        def _pinned(self, m, blocks, exclude, now):
            """The ideal: the replica its first block was dealt (round-robin, in order of first
            arrival), at any load (no slot limit: it waits there rather than move)."""
            up = [r for r in m.replicas if r.instance not in exclude and self.bad_until.get(r.instance, 0.0) <= now]
            if not up:
                return None
            if not blocks:
                return min(up, key=lambda r: self.in_flight.get(r.instance, 0))
            name = rb.pinned(self.pins, blocks[0], [r.instance for r in m.replicas])
            return next((r for r in up if r.instance == name), None)

        def _rule(self, ok, blocks):
            load = [self.in_flight.get(r.instance, 0) for r in ok]
            if policy == "random":
                return self.rng.choice(ok)
            got = [self.index.matched(r.instance, blocks) for r in ok]
            r = ok[rb.sglang(load, got, len(blocks), [self.index.size(x.instance) for x in ok])]
            self.index.insert(r.instance, blocks)
            return r

        def answered(self, *args, **kw):
            return None  # a baseline's index is its own rule's: answers do not correct it

    own = policy in ("cache-aware", "least-outstanding", "cache-aware-learned")
    sized = {} if policy == "cache-aware-learned" else {"prefix_cache_blocks": max(1, cache_chars // 128)}
    s = GatewaySettings(port=port, routing="least-outstanding" if policy == "least-outstanding" else "cache-aware",
                        max_concurrency=16, **sized)  # sized: the engines' cache, as the docs advise
    app = build(db.make_engine(url), s)
    if not own:
        gw = app.state.gateway
        gw.balancer = Baseline(s.queue_timeout_s, s.max_queue, s.bad_s, index=PrefixIndex(1 << 22, 1 << 23))
    uvicorn.Server(uvicorn_config(app, s)).run()


async def one(session, base: str, body: dict, tokens: int) -> dict:
    chat = "messages" in body
    body = {"model": "bench", **body, "max_tokens": tokens, "stream": True, "stream_options": {"include_usage": True}}
    t0, res = time.perf_counter(), {"ok": False}
    try:
        async with session.post(f"{base}/v1/{'chat/completions' if chat else 'completions'}", json=body,
                                headers={"x-gpuflow-debug": "route"}) as r:
            res["route"] = r.headers.get("x-gpuflow-route", "")  # "...; matched=M/N blocks; ...; reason=R; ..."
            async for line in r.content:
                if not line.startswith(b"data: {"):
                    continue
                ev = json.loads(line[6:])
                if "ttft" not in res and any((c.get("delta") or {}).get("content") or c.get("text")
                                             for c in ev.get("choices") or ()):
                    res["ttft"] = time.perf_counter() - t0
                if ev.get("usage"):
                    res["usage"], res["replica"] = ev["usage"], ev.get("system_fingerprint")
            res["ok"] = r.status == 200 and "usage" in res
    except (aiohttp.ClientError, asyncio.TimeoutError):
        pass
    res["end"] = time.perf_counter()
    return res


async def phase(base: str, reqs, tokens: int) -> tuple[list[dict], float]:
    """Every request of ``reqs`` sent at its arrival time; (results, seconds from start to last end)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=300)) as session:
        start = time.perf_counter()

        async def at(t, body):
            await asyncio.sleep(max(0.0, start + t - time.perf_counter()))
            return await one(session, base, body, tokens)
        res = await asyncio.gather(*(at(t, b) for t, _, b in reqs))
    return res, max(r["end"] for r in res) - start


def args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", nargs=3, metavar=("POLICY", "URL", "PORT"), help=argparse.SUPPRESS)
    ap.add_argument("--policies", default=",".join(POLICIES[:4]), help=f"of {', '.join(POLICIES)}")
    ap.add_argument("--workloads", default=",".join(rw.KINDS), help=f"of {', '.join(rw.KINDS)}")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--customers", type=int, default=16)
    ap.add_argument("--prefix-chars", type=int, default=3072, help="each customer's system prompt (48 blocks)")
    ap.add_argument("--question-chars", type=int, default=256)
    ap.add_argument("--fill-customers", type=int, default=16, help="cache-filling's customers")
    ap.add_argument("--fill", type=float, default=0.9, help="cache-filling's prefixes, as a share of all caches")
    ap.add_argument("--rate-fill", type=float, default=20.0, help="cache-filling requests per second")
    ap.add_argument("--cache-blocks", type=int, default=256, help="each engine's prefix cache, in 64-character blocks")
    ap.add_argument("--prefill-ms", type=float, default=3.0, help="per uncached block; prefills run one at a time")
    ap.add_argument("--token-ms", type=float, default=10.0)
    ap.add_argument("--tokens", type=int, default=8, help="generated per request")
    ap.add_argument("--rate", type=float, default=28.0, help="shared-prefix requests per second (Poisson)")
    ap.add_argument("--rate-no-prefix", type=float, default=14.0)
    ap.add_argument("--rate-hot", type=float, default=40.0, help="hot-prefix requests per second")
    ap.add_argument("--hot-zipf", type=float, default=2.0, help="hot-prefix: customer c's weight is 1/(c+1)^this")
    ap.add_argument("--hot-question-chars", type=int, default=768, help="hot-prefix's questions")
    ap.add_argument("--rate-ip", type=float, default=20.0, help="inference-perf requests per second")
    ap.add_argument("--ip-groups", type=int, default=16, help="inference-perf: num_groups")
    ap.add_argument("--ip-system-tokens", type=int, default=384, help="inference-perf: system_prompt_len")
    ap.add_argument("--ip-question-tokens", type=int, default=32, help="inference-perf: question_len")
    ap.add_argument("--inference-perf-python", help="of inference-perf's venv (default .venv/inference-perf)")
    ap.add_argument("--seconds", type=float, default=20.0, help="of arrivals per phase")
    ap.add_argument("--warmup", type=float, default=4.0, help="first seconds of a phase: sent, not counted")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="another draws other arrivals (and other placements); 0: as every run before")
    ap.add_argument("--slowest", type=float, default=0.0, help="print each phase's slowest share of requests (0.02: 2%%; 0: none)")
    return ap.parse_args()


def start(a, url: str, policies) -> list:
    """The engines, in the store as the deployment's replicas (each phase starts its own gateway)."""
    info = "no" if "cache-aware-learned" in policies else "yes"  # its gateway must learn the cache's size
    engines = [gs.cache_engine(f"r{i}", cache_blocks=a.cache_blocks, block_chars=rw.ENGINE_BLOCK, cache_info=info,
                               prefill_block_s=a.prefill_ms / 1000, token_s=a.token_ms / 1000)
               for i in range(a.replicas)]
    from store import db

    store = db.make_engine(url)
    gs.deploy(store, "bench", max_concurrency=16)
    for i, e in enumerate(engines):
        gs.running(store, f"bench-{i}", "bench", e.port)
    return engines


def gateway(a, url: str, tmp: str, pol: str):
    """One policy's gateway, started (its log appended to) and serving the deployment."""
    port = gs.server_port()
    gw = gs.Proc([sys.executable, os.path.abspath(__file__), "--serve", pol, url, str(port),
                  "--cache-blocks", str(a.cache_blocks)], port, os.path.join(tmp, f"gateway-{pol}.log"))
    gs.wait_model(f"http://127.0.0.1:{port}", "bench", a.replicas)
    return gw


def inference_perf(a, tmp: str, kinds: list[str]) -> list[dict] | None:
    """inference-perf's prompts for every round, or None (and why, printed) when it cannot run."""
    if "inference-perf" not in kinds:
        return None
    py, why = rw.inference_perf_python(a.inference_perf_python)
    if py is None:
        print(f"inference-perf workload skipped: {why}", flush=True)
        kinds.remove("inference-perf")
        return None
    tok = rw.smollm2_tokenizer(os.path.join(tmp, "smollm2-tokenizer"))
    ip = rw.inference_perf_prompts(py, tok, a, int(a.rate_ip * a.seconds * 1.5) * a.rounds)
    chars = sum(len(p["prompt"]) for p in ip) / len(ip)
    print(f"inference-perf {py}: {len(ip)} prompts of {a.ip_groups} groups, {a.ip_system_tokens}+{a.ip_question_tokens} "
          f"tokens (SmolLM2's tokenizer) = {chars:.0f} characters on average", flush=True)
    return ip


def main() -> None:
    a = args()
    if a.serve:
        return serve_gateway(a.serve[0], a.serve[1], int(a.serve[2]), a.cache_blocks * rw.ENGINE_BLOCK)
    policies, kinds = a.policies.split(","), a.workloads.split(",")
    tmp = tempfile.mkdtemp(prefix="bench-routing-")
    from store import db

    url = db.sqlite_url(os.path.join(tmp, "gpuflow.db"))
    db.init_db(db.make_engine(url))
    ip = inference_perf(a, tmp, kinds)
    engines = start(a, url, policies)
    try:
        caches = rw.ENGINE_BLOCK * a.cache_blocks * a.replicas
        print(f"{a.replicas} stand-in replicas: cache {a.cache_blocks} blocks of {rw.ENGINE_BLOCK} characters (tail "
              f"freed first), prefill {a.prefill_ms:g} ms a block (one at a time), {a.tokens} tokens at {a.token_ms:g} "
              f"ms; shared-prefix {a.customers} x {a.prefix_chars} characters ({a.customers * a.prefix_chars / caches:.0%} "
              f"of the caches) at {a.rate:g} req/s; cache-filling {a.fill_customers} x {rw.fill_chars(a)} "
              f"({a.fill:.0%}) at {a.rate_fill:g} req/s; hot-prefix Zipf {a.hot_zipf:g} at {a.rate_hot:g} req/s ({a.hot_question_chars}-character questions); inference-perf at {a.rate_ip:g} req/s; no-prefix at "
              f"{a.rate_no_prefix:g} req/s; questions {a.question_chars} characters; {a.rounds} interleaved rounds of "
              f"{a.seconds:g} s a phase ({a.warmup:g} s warm-up); {os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.1f}", flush=True)
        rows = {k: {p: [] for p in policies} for k in kinds}
        for rnd in range(a.rounds):
            for kind in kinds:
                n = int(a.rate_ip * a.seconds * 1.5)
                seed = 1000 * rnd + len(kind) + 100_000 * a.seed
                reqs = rw.workload(kind, a, a.seconds, seed, ip and ip[rnd * n:(rnd + 1) * n])
                ideal, counted = rw.ideal_cached(reqs), [t >= a.warmup for t, _, _ in reqs]
                for pol in (policies if rnd % 2 == 0 else policies[::-1]):  # neither order favours one
                    gw = gateway(a, url, tmp, pol)  # cold as the engines' caches are about to be
                    try:
                        rows[kind][pol].append(run_phase(a, engines, gw, reqs, ideal, counted))
                    finally:
                        gw.stop()
                    last = rows[kind][pol][-1]
                    print(f"  round {rnd + 1} {kind:<15}{pol:<20} p90 {rr.pct(last['ttft'], 90) * 1000:7.0f} ms, "
                          f"full misses {last['misses']}/{last['counted']} ({last['held_missed']} believed held), guard {last['guard']:.0f}x, copies {last['copies']:.0f}x, load average "
                          f"{os.getloadavg()[0]:.1f}", flush=True)
        rr.report({k: {p: rr.merge(v) for p, v in by.items()} for k, by in rows.items()})
    finally:
        for e in engines:
            e.stop()


def run_phase(a, engines, gw, reqs, ideal, counted) -> dict:
    for e in engines:
        asyncio.run(_reset(e.port))
    c0, (g0, k0) = cpu_s(gw.p.pid), moved(gw.port)
    res, took = asyncio.run(phase(f"http://127.0.0.1:{gw.port}", reqs, a.tokens))
    row = rr.summary(res, ideal, took, cpu_s(gw.p.pid) - c0, [f"r{i}" for i in range(a.replicas)], counted)
    if a.slowest:
        slowest(res, reqs, counted, a.slowest)
    g1, k1 = moved(gw.port)
    row["guard"], row["copies"] = g1 - g0, k1 - k0
    return row


def slowest(res, reqs, counted, share: float) -> None:
    """The phase's slowest ``share`` of counted requests (at least 3), each with its arrival, its
    replica, the prompt tokens the engine had cached and the gateway's ``x-gpuflow-route``: which
    choices make the tail."""
    done = sorted(((r["ttft"], t, r.get("replica"), r["usage"]["prompt_tokens_details"]["cached_tokens"],
                    r["usage"]["prompt_tokens"], r.get("route", ""))
                   for r, c, (t, _, _) in zip(res, counted, reqs) if c and r["ok"] and "ttft" in r), reverse=True)
    for ttft, t, replica, cached, prompt, route in done[:max(3, int(len(done) * share))]:
        print(f"    slow: {ttft * 1000:5.0f} ms, sent at {t:5.2f} s, {replica}, cached {cached}/{prompt} tokens, {route}")


def moved(port: int) -> tuple[float, float]:
    """The gateway's ``imbalance`` and ``copy`` decisions so far (one read of its metrics): requests
    the guard sent away from their best match, and requests a spill's copy took while home lagged
    (only the cache-aware gateway makes either)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return tuple(gs.metric(text, "gpuflow_gateway_route_decisions_total", reason=k) for k in ("imbalance", "copy"))


async def _reset(port: int) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"http://127.0.0.1:{port}/reset") as r:
            await r.read()


if __name__ == "__main__":
    main()
