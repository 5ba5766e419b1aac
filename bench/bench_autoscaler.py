"""The same day of traffic through the autoscaling policy before issue 25 (a frozen copy,
bench/autoscale_policy_before.py) and the policy now (scheduler/autoscale/), side by side:
replica-hours, actions, flaps (changes of direction between consecutive actions), the P95 of every
request's latency, and the most replicas held from 02:00 to 05:00 (the quiet night, with one lone
request at 03:00). Asserts nothing.
Run: python bench/bench_autoscaler.py   (or make bench-autoscaler)

The day (seeded, deterministic; Poisson arrivals, second by second):
- 00-01 h: a tail of 1 request/s; 01-05 h: a quiet night with ONE lone request at 03:00;
- 05-06 h: a trickle of 0.1/s; 06-09 h: a ramp to 20/s; 09-17 h: 20/s +- 4 (a slow wave), with
  bursts at 10:30 (2 min at 2.5x), 13:00 (20 s at 4x) and 15:00 (10 min at 1.8x);
- 17-20 h: a ramp down to 2/s; 20-24 h: 2/s, with 60 requests in 3 s at 22:00.

The model: each RUNNING replica decodes 4 requests at once (FCFS queue in front of all slots); a
request of 8-16 tokens takes tokens x TPOT, TPOT = 4 ms + 8 ms x the batch per replica (12 ms
alone, 36 ms full: about 9 requests/s a replica); a new replica serves 60 s after it is added, a
removed one finishes what it holds. Every 15 s the autoscaler sees what a gateway would show:
queue, in flight, and histograms (gpuflow's gateway buckets) of latency, queueing time and TPOT
over the interval, built into a sample exactly as activities/autoscale.py builds it."""

from __future__ import annotations

import heapq
import math
import os
import random
import sys
from collections import deque
from dataclasses import dataclass, field

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import autoscale_policy_before as before  # noqa: E402
from gateway.metrics import LATENCY  # noqa: E402
from scheduler.autoscale import policy as now_policy  # noqa: E402
from scheduler.autoscale.config import Autoscaling  # noqa: E402
from scheduler.autoscale.histogram import Histogram  # noqa: E402
from scheduler.autoscale.signals import Window, combine  # noqa: E402

DAY, INTERVAL, SLOTS, START_S, SEED = 86400, 15, 4, 60, 25
H = 3600
BURSTS = [(10.5 * H, 120, 2.5), (13 * H, 20, 4.0), (15 * H, 600, 1.8)]


def rate(t: float) -> float:
    if t < 1 * H:
        r = 1.0
    elif t < 5 * H:
        r = 0.0
    elif t < 6 * H:
        r = 0.1
    elif t < 9 * H:
        r = 0.1 + 19.9 * (t - 6 * H) / (3 * H)
    elif t < 17 * H:
        r = 20 + 4 * math.sin(2 * math.pi * (t - 9 * H) / (4 * H))
    elif t < 20 * H:
        r = 20 - 18 * (t - 17 * H) / (3 * H)
    else:
        r = 2.0
    return r * next((f for b, d, f in BURSTS if b <= t < b + d), 1.0)


def arrivals(seed: int = SEED) -> list[tuple[float, int]]:
    """(arrival time, tokens), sorted: the same list for every policy."""
    rng, out = random.Random(seed), []
    for t in range(DAY):
        lam, p = rate(t), rng.random()
        k, term = 0, math.exp(-lam)  # Poisson(lam) by inversion
        acc = term
        while p > acc and k < 1000:
            k += 1
            term *= lam / k
            acc += term
        out += [(t + rng.random(), rng.randint(8, 16)) for _ in range(k if lam > 0 else 0)]
    out.append((3 * H + 0.5, 40))  # the lone request: a long answer, 40 x 12 ms = 0.48 s (P95 reads 488 ms)
    out += [(22 * H + 3 * rng.random(), rng.randint(8, 16)) for _ in range(60)]  # the spike
    return sorted(out)


def hist(values: list[float]) -> Histogram:
    b = {le: float(sum(1 for v in values if v <= le)) for le in LATENCY}
    return Histogram.of({**b, math.inf: float(len(values))}, count=len(values), total=sum(values))


@dataclass
class Result:
    replica_s: float = 0.0
    actions: int = 0
    flaps: int = 0
    latencies: list[float] = field(default_factory=list)
    night_max: int = 0
    peak: int = 0


def simulate(cfg: Autoscaling, traffic: list[tuple[float, int]], old: bool) -> Result:
    res, state = Result(), (before.PolicyState() if old else now_policy.PolicyState())
    current, pending = cfg.min_replicas, []  # pending: ready times of replicas still starting
    servers = [0.0] * (SLOTS * current)  # heap of slot free times, RUNNING replicas only
    queue: deque = deque()
    flight: list[tuple[float, float, float, int, float]] = []  # (arrival, start, finish, tokens, tpot)
    hist_, last_dir, i = [], 0, 0
    for t in range(DAY):
        while pending and pending[0] <= t:
            pending.pop(0)
            servers += [float(t)] * SLOTS
            heapq.heapify(servers)
        while i < len(traffic) and traffic[i][0] < t + 1:
            queue.append(traffic[i])
            i += 1
        running = len(servers) // SLOTS
        busy = sum(1 for f in servers if f > t)
        while queue and servers and servers[0] < t + 1:
            arr, tok = queue[0]
            start = max(servers[0], arr)
            if start >= t + 1:
                break
            queue.popleft()
            heapq.heappop(servers)
            tp = 0.004 + 0.008 * max(1.0, (busy + 1) / max(running, 1))
            busy += 1
            finish = start + tok * tp
            heapq.heappush(servers, finish)
            flight.append((arr, start, finish, tok, tp))
        res.replica_s += current
        res.peak = max(res.peak, current)
        if 2 * H <= t < 5 * H:  # an hour after the last request before the night, the lone one included
            res.night_max = max(res.night_max, current)
        if t % INTERVAL != INTERVAL - 1:
            continue
        at = float(t + 1)
        done = [f for f in flight if f[2] <= at]
        flight = [f for f in flight if f[2] > at]
        lat = [f[2] - f[0] for f in done]
        res.latencies += lat
        gwin = Window(waiting=float(len(queue)), running=float(len(flight)), latency=hist(lat) if lat else None,
                      queue_time=hist([f[1] - f[0] for f in done]) if done else None,
                      tpot=Histogram.of({}, count=sum(f[3] for f in done), total=sum(f[3] * f[4] for f in done))
                      if done else None)
        sample = combine(at, running, [], gwin)
        if old:
            sample = before.Sample(at=at, running_replicas=running, requests=sample.requests, queue=sample.queue,
                                   tpot_s=sample.tpot_s, latency_p95_s=sample.latency_p95_s,
                                   queue_time_p90_s=sample.queue_time_p90_s)
        hist_ = (hist_ + [sample])[-200:]
        d, state = (before.decide if old else now_policy.decide)(cfg, hist_, current, len(pending), at, state)
        if d.desired == current:
            continue
        res.actions += 1
        direction = 1 if d.desired > current else -1
        res.flaps += last_dir != 0 and direction != last_dir
        last_dir = direction
        if direction > 0:
            pending += [at + START_S] * (d.desired - current)
        else:
            drop = current - d.desired
            gone = min(drop, len(pending))
            pending = pending[:len(pending) - gone]  # the newest (still starting) go first
            for _ in range((drop - gone) * SLOTS):
                servers.remove(max(servers))  # they finish what they hold, then stop
            heapq.heapify(servers)
        current = d.desired
    return res


def p95(values: list[float]) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(0.95 * len(v)))] if v else float("nan")


CONFIGS = {
    "latency_p95 (defaults)": {"rules": ["latency_p95"]},
    # thresholds at the gateway's bucket bounds (0.25, 0.5): judged by counts, not by interpolation
    "latency_p95 (0.5 s / 0.25 s)": {"rules": [{"kind": "latency_p95", "up_above_s": 0.5, "down_below_s": 0.25}]},
    "queue_tpot (fit to this engine)": {"rules": [{"kind": "queue_tpot", "up_queue": 2, "up_tpot_s": 0.030,
                                                   "down_queue": 0.5, "down_tpot_s": 0.020}]},
}


def main() -> None:
    traffic = arrivals()
    print(f"one seeded day (seed {SEED}): {len(traffic):,} requests, a decision every {INTERVAL} s, "
          f"replicas serve {START_S} s after they are added, {SLOTS} requests at once each")
    print(f"{'rules':<32} {'policy':<7} {'replica-h':>9} {'actions':>8} {'flaps':>6} {'p95 latency':>12} "
          f"{'peak':>5} {'night max':>10}")
    for name, extra in CONFIGS.items():
        for label, old in (("before", True), ("now", False)):
            mod = before if old else None
            data = {"min_replicas": 1, "max_replicas": 10, **extra}
            cfg = (mod.Autoscaling if old else Autoscaling).model_validate(data)
            r = simulate(cfg, traffic, old)
            print(f"{name:<32} {label:<7} {r.replica_s / 3600:>9.1f} {r.actions:>8} {r.flaps:>6} "
                  f"{p95(r.latencies) * 1000:>9.0f} ms {r.peak:>5} {r.night_max:>10}")


if __name__ == "__main__":
    main()
