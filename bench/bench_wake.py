"""What one wake costs as the PENDING queue grows (issue 14: the rate at which PENDING replicas
are woken must not grow with their number). Prints figures; asserts nothing.

A SQLite store with 100 workers x 8 GPUs of 80 GiB, every GPU held but one (799 running
replicas of 80 GiB); N replicas of 40 GiB PENDING across three tenants, in D deployments. One
wake (activities/wake_queue.py, what ``Waker.wake`` runs after a release): refresh the cached
snapshot, read the queue, run the policy pass. Columns:
- signals: replicas the wake signals (each then runs one decide activity). Before the queue,
  every PENDING replica was signalled: N signals and N decide activities per capacity change.
- decisions: policy runs inside the pass (one per woken replica and per deployment that waits).
- wall / CPU ms: the whole wake, median of 5, with a warm snapshot cache (as on a control-plane
  worker). CPU is the steadier figure on a shared machine.

Run: ``.venv/bin/python bench/bench_wake.py``."""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sqlmodel import Session  # noqa: E402

from activities.estimate_cache import EstimateCache  # noqa: E402
from contracts.control import PlacementPlan  # noqa: E402
from store import db, tenants  # noqa: E402
from store.snapshot_cache import SnapshotCache  # noqa: E402
from store.tables import DeploymentRow, InstanceRow, WorkerRow  # noqa: E402
from activities.wake_queue import judge, known_request, read  # noqa: E402
from scheduler.tenancy.config import TenantsFile  # noqa: E402
from scheduler.units import GiB  # noqa: E402

WORKERS, GPUS = 100, 8
TENANTS = TenantsFile.model_validate({"tenants": [{"name": "prod", "priority": 100}, {"name": "dev", "priority": 30},
                                                  {"name": "poc", "priority": 10}]})


def raw(name: str, tenant: str, gib: int) -> dict:
    return {"name": name, "backend": "custom", "run_command": "serve {port}", "source": {"local_path": f"/m/{name}"},
            "resources": {"vram": gib * GiB, "ram": GiB}, "tenant": tenant}


def populate(engine, pending: int, deployments: int) -> None:
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    with Session(engine) as s:
        s.add_all(WorkerRow(name=f"w{w:03d}", ram_total=2048 * GiB, generation=1,
                            gpus=[{"index": i, "vram_total": 80 * GiB} for i in range(GPUS)]) for w in range(WORKERS))
        s.add(DeploymentRow(name="fill", spec=raw("fill", "prod", 80), replicas=WORKERS * GPUS - 1))
        for k in range(WORKERS * GPUS - 1):  # every GPU held but the last one
            w, g = f"w{k // GPUS:03d}", k % GPUS
            p = PlacementPlan(worker=w, gpu_indexes=[g], claim={"vram": {g: 80 * GiB}, "ram": GiB})
            s.add(InstanceRow(name=f"fill-{k}", deployment="fill", model="fill", state="running", worker=w,
                              gpu_indexes=[g], placement=p.model_dump(mode="json")))
        names = [f"d{d}" for d in range(deployments)]
        for d, name in enumerate(names):
            s.add(DeploymentRow(name=name, spec=raw(name, ("prod", "dev", "poc")[d % 3], 40), replicas=1))
        for k in range(pending):
            dep = names[k % deployments]
            s.add(InstanceRow(name=f"{dep}-{k}", deployment=dep, model=dep, state="pending",
                              reason="unschedulable: no GPU free", queued_at=t0 + timedelta(seconds=k)))
        s.commit()
    tenants.apply(engine, TENANTS)


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def one(pending: int, deployments: int) -> str:
    engine = db.make_engine(db.sqlite_url(os.path.join(tempfile.mkdtemp(), "gpuflow.db")))
    db.init_db(engine)
    populate(engine, pending, deployments)
    cache, estimates = SnapshotCache(), EstimateCache()
    cache.refresh(engine)  # a control-plane worker's cache is warm
    wall, cpu, v = [], [], None
    for _ in range(5):
        t, c = time.perf_counter(), time.process_time()
        snap = cache.refresh(engine)[0]
        v = judge(read(engine), snap, lambda s: known_request(estimates, s))
        wall.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
    engine.dispose()
    return (f"{pending:>8} {deployments:>11} {len(v.to_signal()):>8} {pending:>15} {v.wake.decisions:>10} "
            f"{median(wall):>9.1f} {median(cpu):>9.1f}")


def main() -> None:
    print(f"one wake after one GPU frees: {WORKERS} workers x {GPUS} GPUs, all held but one")
    print(f"{'pending':>8} {'deployments':>11} {'signals':>8} {'signals before':>15} {'decisions':>10} "
          f"{'wall ms':>9} {'CPU ms':>9}")
    for pending, deployments in ((10, 3), (100, 12), (1000, 12), (5000, 12), (100, 100), (1000, 300)):
        print(one(pending, deployments), flush=True)


if __name__ == "__main__":
    main()
