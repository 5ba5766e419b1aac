"""A prefill/decode group's decisions by cluster size: 10, 100, 500 and 1,000 workers with 8 GPUs
each (racks of 8 workers, zones of 4 racks, half the GPUs held by other models), for a 1P1D, a
4P2D and an 8P8D+router group of custom engines (one 40 GiB GPU share a member): the formation
(scheduler/groups/form.py), one more decode placed alone (scale_out.py) and scale-in's choice
(scale_in.py), beside one plain replica's decision (decide) on the same snapshot. Median of a few
runs, milliseconds; compare rows of one run (a shared machine is noisy). Run: python bench/bench_groups.py."""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from scheduler.cluster import ClusterSnapshot  # noqa: E402
from scheduler.decide import decide  # noqa: E402
from scheduler.groups.form import form  # noqa: E402
from scheduler.groups.roles import role_spec  # noqa: E402
from scheduler.groups.scale_in import scale_in  # noqa: E402
from scheduler.groups.scale_out import scale_out  # noqa: E402
from scheduler.groups.spec import RoleName  # noqa: E402
from scheduler.request import FlatRequest  # noqa: E402
from scheduler.spec import ModelSpec  # noqa: E402
from scheduler.units import GiB  # noqa: E402

P, D = RoleName.PREFILL, RoleName.DECODE
REQ = FlatRequest(vram=40 * GiB, ram=4 * GiB)
SHAPES = {"1P1D": (1, 1, False), "4P2D": (4, 2, False), "8P8D+router": (8, 8, True)}


def snapshot(n: int) -> ClusterSnapshot:
    workers, instances = [], []
    for w in range(n):
        labels = {"topology.gpustack.ai/zone": f"z{w // 32}", "topology.gpustack.ai/rack": f"r{w // 8}"}
        workers.append({"name": f"w{w}", "ram_total": 512 * GiB, "labels": labels,
                        "gpus": [{"index": i, "vram_total": 80 * GiB} for i in range(8)]})
        for k in range(4):  # half the GPUs held by other models
            instances.append({"name": f"o{w}-{k}", "model": "other", "worker": f"w{w}", "gpu_indexes": [k],
                              "claim": {"ram": 4 * GiB, "vram": {k: 72 * GiB}}})
    return ClusterSnapshot.model_validate({"workers": workers, "instances": instances})


def group(p: int, d: int, router: bool) -> ModelSpec:
    roles = [{"name": "prefill", "replicas": p}, {"name": "decode", "replicas": d}] + ([{"name": "router"}] if router else [])
    return ModelSpec(name="g", source={"huggingface": {"repo": "org/m"}}, backend="custom", run_command="x {port}",
                     roles=roles, disaggregation={"mode": "custom"},
                     gather={"strategy": "PreferGather", "layer": "builtin-000003"})


def ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def with_members(snap: ClusterSnapshot, spec: ModelSpec):
    """``snap`` with ``spec``'s group formed in it (its members as instances with role and group)."""
    g = form(snap, spec, {P: REQ, D: REQ})
    extra = [{"name": f"g-{k}", "model": "g", "worker": m.worker, "gpu_indexes": m.gpu_indexes, "role": m.role.value,
              "group": "g", "claim": m.decision.placement.claim.model_dump()} for k, m in enumerate(g.members)]
    return ClusterSnapshot.model_validate({**snap.model_dump(), "instances": [*snap.model_dump()["instances"], *extra]})


def main() -> None:
    print(f"{'workers':>8} {'group':<12} {'plain ms':>9} {'form ms':>9} {'scale-out ms':>13} {'scale-in ms':>12}")
    for n in (10, 100, 500, 1000):
        snap = snapshot(n)
        runs = 5 if n <= 100 else 3
        for label, (p, d, router) in SHAPES.items():
            spec = group(p, d, router)
            plain = ms(lambda: decide(snap, role_spec(spec, D), REQ), runs)
            formed = ms(lambda: form(snap, spec, {P: REQ, D: REQ}), runs)
            full = with_members(snap, spec)
            out = ms(lambda: scale_out(full, spec, D, REQ, "g"), runs)
            into = ms(lambda: scale_in(full, spec, P, "g"), runs)
            print(f"{n:>8} {label:<12} {plain:>9.1f} {formed:>9.1f} {out:>13.1f} {into:>12.1f}", flush=True)


if __name__ == "__main__":
    main()
