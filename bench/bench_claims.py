"""Learned memory claims on a simulated fleet (issue 42): what booking the learned claim instead of
the estimate changes, under mode advise and mode apply.

The fleet: ``--hosts`` hosts (default 100) of 4 GPUs of 80 GiB. The deployments (custom engines,
one flat claim each) use a share of their estimate that differs from it, as GPUStack's users saw
(a 14 GiB estimate for 5 GiB of use, 1 GiB for 4): most use less, one uses more (1.3x). Each
replica's use is its share of the estimate times a noise of +-5% (seeded).

1. Learning: each deployment's measured peaks (``--samples`` a deployment, one a minute) go
   through the real recommender (scheduler/claims/: p90 + 15%, VPA's decaying histogram), with
   MIN_SAMPLES 30 and MIN_HISTORY_S 1800 as a rehearsal sets them; each is then confident.
2. Placement, once per mode: the deployments scale up one after another, each to 3 replicas per
   host (more than the fleet holds by the estimate), binpacked, each replica decided by the real policy (scheduler/decide.py) on the fleet with the replicas
   placed before it, booking what scheduler/claim_apply.py says for the mode. Then the
   simulated hosts' OOM judge (worker_agent/sim_oom.py) runs on every GPU: a replica whose use
   passes what its GPU has free dies. Under advise an OOM'd replica restarts where it was
   (the estimate has not changed) and dies again: it is counted, and left out of the running
   ones. Under apply its claim is bumped at once (max(1.2x, +100 MiB) of its use: C2's bump) and
   it is placed again, until no GPU is overfull.

Prints, per mode: replicas running, OOMs, VRAM booked, VRAM used, used/booked, and per deployment
the replicas running. Run: make bench-claims (or python bench/bench_claims.py [--hosts N]).
Deterministic for a seed; about a minute at 100 hosts on one core."""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from scheduler.claim_apply import ADVISE, APPLY, applied  # noqa: E402
from scheduler.claims.recommender import recommend  # noqa: E402
from scheduler.claims.settings import ClaimSettings  # noqa: E402
from scheduler.claims.state import ClaimState, bump, observe  # noqa: E402
from scheduler.cluster import GPU, ClusterSnapshot, Instance, Worker  # noqa: E402
from scheduler.decide import decide  # noqa: E402
from scheduler.learned_claim import LearnedClaim  # noqa: E402
from scheduler.request import FlatRequest  # noqa: E402
from scheduler.spec import ModelSpec  # noqa: E402
from scheduler.units import GiB  # noqa: E402
from worker_agent.sim_oom import Use, victims  # noqa: E402

GPUS, GPU_GIB = 4, 80
# name, estimate (GiB), weights (GiB), share of the estimate it uses
KINDS = [("rope-scaled", 12, 4, 1.3), ("chat-8b", 20, 16, 0.45), ("code-14b", 36, 28, 0.55), ("embed", 14, 1, 0.35),
         ("long-ctx", 30, 14, 0.9), ("vision-32b", 72, 60, 0.8)]
WANT = 3  # replicas each deployment asks for, per host of the fleet
SETTINGS = ClaimSettings(min_samples=30, min_history_s=1800)
NOISE = 0.05


def fleet(hosts: int) -> ClusterSnapshot:
    return ClusterSnapshot(workers=[Worker(name=f"h{k:03d}", ram_total=2048 * GiB, gpus=[
        GPU(index=i, name="NVIDIA H100 80GB HBM3", vram_total=GPU_GIB * GiB) for i in range(GPUS)])
        for k in range(hosts)], instances=[])


def spec(name: str) -> ModelSpec:
    return ModelSpec(name=name, source={"local_path": f"/models/{name}"}, backend="custom",
                     run_command="serve {port}", resources={"vram": 1, "ram": GiB}, placement_strategy="binpack")


def learn(rng: random.Random, samples: int) -> dict[str, ClaimState]:
    out = {}
    for name, est, _, share in KINDS:
        s = ClaimState()
        for t in range(samples):
            s = observe(s, int(est * GiB * share * rng.uniform(1 - NOISE, 1 + NOISE)), 60.0 * t, SETTINGS)
        out[name] = s
    return out


def learned(state: ClaimState, est: int, weights: int, now: float) -> LearnedClaim | None:
    rec = recommend(state, SETTINGS, now, estimate_bytes=est, weights_bytes=weights)
    if not (rec.confident and rec.claim_bytes):
        return None
    return LearnedClaim(claim=rec.claim_bytes, estimate=est, samples=rec.samples, span_s=rec.span_s,
                        percentile=rec.percentile, margin=rec.margin, value=rec.percentile_bytes or 0,
                        confidence=rec.confidence, bumped=bool(rec.bump_bytes), floor=rec.floor_bytes)


class Run:
    def __init__(self, mode: str, hosts: int, states: dict[str, ClaimState], rng: random.Random, now: float):
        self.mode, self.states, self.rng, self.now = mode, dict(states), rng, now
        self.snap = fleet(hosts)
        self.use: dict[str, int] = {}  # instance -> bytes it uses
        self.ooms = 0
        self.n = 0

    def request(self, name: str) -> FlatRequest:
        _, est, weights, _ = next(k for k in KINDS if k[0] == name)
        req = FlatRequest(vram=est * GiB, ram=GiB, weight_bytes=weights * GiB, basis="bench")
        return applied(req, "custom", [], learned(self.states[name], est * GiB, weights * GiB, self.now), self.mode)[0]

    def place(self, name: str, use: int) -> bool:
        d = decide(self.snap, spec(name), self.request(name))
        if not d.scheduled:
            return False
        self.n += 1
        c = d.placement
        inst = Instance(name=f"{name}-{self.n}", model=name, worker=c.worker, gpu_indexes=c.gpu_indexes,
                        claim={"ram": c.claim.ram, "vram": c.claim.vram})
        self.snap = self.snap.model_copy(update={"instances": self.snap.instances + [inst]})
        self.use[inst.name] = use
        return True

    def fill(self, want: int) -> None:
        """Each deployment in turn scales to ``want`` replicas, or as many as fit."""
        for name, est, _, share in KINDS:
            for _ in range(want):
                if not self.place(name, int(est * GiB * share * self.rng.uniform(1 - NOISE, 1 + NOISE))):
                    break

    def judge(self) -> list[Instance]:
        """The replicas the OOM judge kills, GPU by GPU, in placement order."""
        uses = [Use(i.name, {(i.worker, g): self.use[i.name] // len(i.gpu_indexes) for g in i.gpu_indexes})
                for i in self.snap.instances]
        free = {(w.name, g.index): g.vram_total for w in self.snap.workers for g in w.gpus}
        dead = victims(free, uses)
        return [i for i in self.snap.instances if i.name in dead]

    def settle(self, rounds: int = 20) -> None:
        for _ in range(rounds):
            dead = self.judge()
            if not dead:
                return
            self.ooms += len(dead)
            gone = {i.name for i in dead}
            self.snap = self.snap.model_copy(update={"instances": [i for i in self.snap.instances if i.name not in gone]})
            if self.mode != APPLY:
                return  # advise: the estimate is unchanged, so each restarts where it was and dies again
            for i in dead:  # apply: its claim bumped at once, then placed again where a GPU holds it
                self.states[i.model] = bump(self.states[i.model], self.use[i.name], i.claim.vram_total, self.now,
                                            SETTINGS, "oom")
                self.place(i.model, self.use.pop(i.name))

    def row(self) -> dict:
        running = self.snap.instances
        booked = sum(i.claim.vram_total for i in running)
        used = sum(self.use[i.name] for i in running)
        per = {name: sum(i.model == name for i in running) for name, *_ in KINDS}
        return {"mode": self.mode, "running": len(running), "ooms": self.ooms, "booked": booked, "used": used, "per": per}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=100, help="simulated hosts (4 GPUs of 80 GiB each)")
    ap.add_argument("--samples", type=int, default=60, help="measured peaks per deployment before placing (one a minute)")
    ap.add_argument("--seed", type=int, default=1, help="the noise's seed")
    a = ap.parse_args()
    states = learn(random.Random(a.seed), a.samples)
    now = 60.0 * a.samples
    print(f"fleet: {a.hosts} hosts x {GPUS} GPUs x {GPU_GIB} GiB = {a.hosts * GPUS * GPU_GIB:,} GiB")
    print("deployment   estimate  uses    learned (p90 + 15%)")
    for name, est, weights, share in KINDS:
        c = learned(states[name], est * GiB, weights * GiB, now)
        print(f"{name:<12} {est:>5} GiB  {share:>4.2f}x  {c.claim / GiB:>6.1f} GiB")
    rows = []
    for mode in (ADVISE, APPLY):
        t = time.perf_counter()
        run = Run(mode, a.hosts, states, random.Random(a.seed + 1), now)
        run.fill(WANT * a.hosts)
        run.settle()
        rows.append(run.row() | {"s": time.perf_counter() - t})
    print("\nmode    running  OOMs  VRAM booked  VRAM used  used/booked  seconds")
    for r in rows:
        print(f"{r['mode']:<7} {r['running']:>7}  {r['ooms']:>4}  {r['booked'] / GiB:>9,.0f} G  {r['used'] / GiB:>7,.0f} G"
              f"  {r['used'] / max(r['booked'], 1):>10.2f}  {r['s']:>7.1f}")
    print("\nrunning per deployment: " + "; ".join(
        f"{name} {rows[0]['per'][name]} -> {rows[1]['per'][name]}" for name, *_ in KINDS))


if __name__ == "__main__":
    main()
