"""The cluster's six reads through the control plane at fleet size (issue 34: each in under 0.5 s
p50 on a quiet machine at 1,000 replicas, and no workflow history per read). Usage:

    python bench/bench_reads.py [--hosts 100] [--replicas 1000] [--reps 20]

The store is filled as bench/bench_console.py fills it (its ``fill``: hosts, deployments,
replicas booked and RUNNING, the last 10 PENDING), plus 200 API keys and 50 tenants' worth of a
day's usage; a Temporal dev server and one control-plane worker (``gpuflow server``) are started
over it, as ``gpuflow dev`` starts them. Each read is asked ``--reps`` times with the client the
CLI uses (gpuflow/cluster_client.py: ``keys list``, ``keys usage``, ``tenants``, ``queue``, what
``status`` adds about serving, ``explain --history``), one after another. Per read: p50 and p95 of
the whole call, and the history events the reads added to the cluster's workflows (``cluster``,
and ``cluster-reads`` where it exists). Then ``gpuflow keys list``, ``queue`` and ``tenants``
are run whole ``--commands`` times (Python's start included). Asserts nothing."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_console import PENDING, PER_DEPLOYMENT, fill  # noqa: E402
from store import db, key_usage, keys  # noqa: E402

WORKFLOWS = ("cluster", "cluster-reads")  # whose history a read could grow


def fill_keys(engine, n: int = 200) -> None:
    """``n`` keys of tenant default, each with requests counted this minute (store/key_usage.py)."""
    now = datetime.now(timezone.utc)
    made = [keys.create(engine, "default", f"key {i}")[1] for i in range(n)]
    minute = key_usage.minute_of(now)
    key_usage.add(engine, "bench", {(minute, k.id, k.tenant, "model-0"): key_usage.Counts(3, 100, 50)
                                    for k in made})


def reads(cl, client, names: list[str]) -> dict:
    """Read name -> a coroutine function asking it once, as the CLI does."""
    return {
        "keys list": lambda: cl.list_keys(client),
        "keys usage": lambda: cl.key_usage(client),
        "tenants": lambda: cl.tenants(client),
        "queue": lambda: cl.queue(client),
        "serving (status)": lambda: cl.serving(client, names),
        "audit (explain --history)": lambda: cl.audit(client, names[0].rsplit("-", 1)[0], True, 200, "", False),
    }


async def events(client) -> int:
    """Every event in the histories of the cluster's workflows (0 for one that does not exist)."""
    n = 0
    for wid in WORKFLOWS:
        try:
            n += len((await client.get_workflow_handle(wid).fetch_history()).events)
        except Exception:  # noqa: BLE001  no such workflow (before or after the change)
            pass
    return n


async def measure(address: str, replicas: int, reps: int) -> None:
    from gpuflow import cluster_client as cl
    from gpuflow.runtime import connect
    from gpuflow.settings import TemporalSettings

    client = await connect(TemporalSettings(address=address), wait_s=30)
    names = [f"model-{k // PER_DEPLOYMENT}-{k % PER_DEPLOYMENT}" for k in range(replicas)]
    asks = reads(cl, client, names)
    for ask in asks.values():  # the first of each (the workflows' start, a cold cache) is not counted
        await ask()
    settled = -1
    while settled != (settled := await events(client)):  # a workflow's first task may land just after
        await asyncio.sleep(0.5)
    print(f"{'read':<28} {'p50 ms':>8} {'p95 ms':>8} {'rows':>6} {'events/read':>12}")
    for name, ask in asks.items():
        before = await events(client)
        took = []
        for _ in range(reps):
            t0 = time.perf_counter()
            got = await ask()
            took.append((time.perf_counter() - t0) * 1000)
        added = (await events(client) - before) / reps
        rows = len(got[1]) if isinstance(got, tuple) else len(got) if isinstance(got, list) else "-"
        p95 = statistics.quantiles(took, n=20)[-1] if len(took) > 1 else took[0]
        print(f"{name:<28} {statistics.median(took):8.1f} {p95:8.1f} {rows:>6} {added:12.1f}", flush=True)


def commands(address: str, reps: int) -> None:
    """The whole CLI command, as an operator runs it (Python's start and imports included)."""
    import subprocess

    for argv in (["keys", "list"], ["queue"], ["tenants"]):
        took = []
        for _ in range(reps):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "gpuflow", *argv, "--address", address], check=True,
                           stdout=subprocess.DEVNULL)
            took.append((time.perf_counter() - t0) * 1000)
        print(f"{'gpuflow ' + ' '.join(argv):<28} {statistics.median(took):8.1f} {max(took):8.1f}  (whole command, "
              f"median and max of {reps})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=100)
    ap.add_argument("--replicas", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--commands", type=int, default=3, help="times each CLI command is run whole (0: none)")
    a = ap.parse_args()
    from gpuflow.dev import Stack
    from gpuflow.ports import server_port

    stack = Stack(os.path.join(tempfile.mkdtemp(prefix="gpuflow-bench-reads-"), "gpuflow"), port=server_port(),
                  ui_port=None)
    engine = db.make_engine(stack.database_url)
    db.init_db(engine)
    fill(engine, a.hosts, a.replicas)
    fill_keys(engine)
    print(f"store: {a.hosts} hosts, {a.replicas} replicas ({PENDING} PENDING), 200 keys; {os.cpu_count()} CPUs")
    try:
        stack.start_temporal()
        stack.start_server()
        asyncio.run(measure(stack.temporal.address, a.replicas, a.reps))
        commands(stack.temporal.address, a.commands)
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
