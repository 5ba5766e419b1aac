"""bench_decide's second table: the decide activity's work against a real store (SQLite file)."""

from __future__ import annotations

import os
import statistics
import tempfile
import time

from sqlmodel import Session

from contracts.decision_of import decision_record
from contracts.control import InstanceRecord, PlacementPlan
from store import db, ledger, records
from store.snapshot import generations, load_snapshot
from store.snapshot_cache import SnapshotCache
from store.tables import InstanceRow, WorkerRow
from scheduler.decide import decide
from scheduler.request import FlatRequest
from scheduler.spec import ModelSpec
from scheduler.units import GiB

SPEC = ModelSpec(name="c", source={"huggingface": {"repo": "o/c"}}, backend="custom", run_command="x")
REQ = FlatRequest(vram=30 * GiB, ram=8 * GiB)


def populate(engine, workers: int, instances: int) -> None:
    """``workers`` hosts of 8 x 80 GiB; ``instances`` running replicas spread over them, each
    holding 8 GiB of one GPU (a ledger-consistent placement, as reserve writes it)."""
    with Session(engine) as s:
        s.add_all(WorkerRow(name=f"w{w:05d}", ram_total=1024 * GiB, labels={"zone": f"z{w % 4}"}, generation=1,
                            gpus=[{"index": i, "vram_total": 80 * GiB, "vram_used": 0} for i in range(8)])
                  for w in range(workers))
        rows = []
        for k in range(instances):
            w, g = f"w{k % workers:05d}", (k // workers) % 8
            p = PlacementPlan(worker=w, gpu_indexes=[g], claim={"vram": {g: 8 * GiB}, "ram": GiB})
            rows.append(InstanceRow(name=f"i{k:06d}", deployment=f"d{k % 50}", model=f"m{k % 50}", state="running",
                                    worker=w, gpu_indexes=[g], placement=p.model_dump(mode="json")))
        s.add_all(rows)
        s.commit()


def stats(ms: list[float]) -> str:
    ms = sorted(ms) or [0.0]
    p95 = ms[min(len(ms) - 1, int(round(0.95 * (len(ms) - 1))))]
    return f"{statistics.median(ms):>8.1f} {p95:>8.1f}"


def one_booking(engine, k: int) -> None:
    """What happens between two decisions in a burst: a replica is created and booked."""
    name = f"new-{k:05d}"  # a replica of deployment "new": only those its deployment wants are booked
    if k == 0:
        records.save_deployment(engine, "new", SPEC.model_dump(mode="json"), 1)
    records.create_instance(engine, InstanceRecord(name=name, deployment="new", model="c", state="pending"))
    w = f"w{k:05d}"
    ledger.reserve(engine, name, PlacementPlan(worker=w, gpu_indexes=[7], claim={"vram": {7: GiB}, "ram": GiB}))


def timed(fn, reps: int) -> tuple[list[float], list[float]]:
    """Wall and CPU milliseconds per call (CPU: this process; the steadier figure when the
    machine is shared, since wall includes waiting for a core)."""
    wall, cpu = [], []
    for _ in range(reps):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
    return wall, cpu


def activity_work(cache: SnapshotCache, engine, k, reps: int) -> tuple[list[float], list[float]]:
    """What Decider.decide does after the estimate (activities/decider.py): refresh, policy (the
    replica being placed excluded), and the decision record it returns (the top candidates as dicts)."""
    wall, cpu = [], []
    for _ in range(reps):
        one_booking(engine, next(k))  # not timed
        t, c = time.perf_counter(), time.process_time()
        snap, gens = cache.refresh(engine)
        decision_record(decide(snap, SPEC, REQ, exclude="new-replica"), REQ, len(snap.workers), gens)
        wall.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
    return wall, cpu


def store_table() -> None:
    print()
    print("decide activity on a SQLite store (ms; one booking between cached decisions)")
    print(f"{'':>8} {'':>9} {'':>34} {'wall':>17} {'CPU':>17}")
    print(f"{'workers':>8} {'instances':>9} {'what':>34} {'median':>8} {'p95':>8} {'median':>8} {'p95':>8}")
    for workers, instances in ((1000, 2000), (1000, 10000), (5000, 10000)):
        engine = db.make_engine(db.sqlite_url(os.path.join(tempfile.mkdtemp(), "gpuflow.db")))
        db.init_db(engine)
        populate(engine, workers, instances)
        snap = load_snapshot(engine)
        small = workers <= 1000
        rows = {
            "policy alone": timed(lambda: decide(snap, SPEC, REQ), 20 if small else 7),
            # a new instances list is a new snapshot to the policy: its occupancy is summed again
            "policy, sums built (new snapshot)": timed(
                lambda: decide(snap.model_copy(update={"instances": list(snap.instances)}), SPEC, REQ), 5 if small else 3),
            "full load + policy (before)": timed(
                lambda: (generations(engine), decide(load_snapshot(engine), SPEC, REQ)), 5 if small else 3),
        }
        cache = SnapshotCache()
        cache.refresh(engine)  # the worker's first decision loads everything once
        k = iter(range(10**6))
        refresh, total = ([], []), ([], [])
        for _ in range(20 if small else 7):
            one_booking(engine, next(k))  # not timed
            t, c = time.perf_counter(), time.process_time()
            snap2, _ = cache.refresh(engine)
            t2, c2 = time.perf_counter(), time.process_time()
            decide(snap2, SPEC, REQ)
            refresh[0].append((t2 - t) * 1000)
            refresh[1].append((c2 - c) * 1000)
            total[0].append((time.perf_counter() - t) * 1000)
            total[1].append((time.process_time() - c) * 1000)
        rows["cached refresh alone"] = refresh
        rows["cached refresh + policy (now)"] = total
        rows["refresh + policy + record"] = activity_work(cache, engine, k, 20 if small else 7)
        rows["policy alone, cached snapshot"] = timed(lambda: decide(snap2, SPEC, REQ), 20 if small else 7)
        for what, (wall, cpu) in rows.items():
            print(f"{workers:>8} {instances:>9} {what:>34} {stats(wall)} {stats(cpu)}")
        assert cache.stats.full == 1
        engine.dispose()
