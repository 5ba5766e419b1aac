"""The console's pages at fleet size (issue 28: each page's data ready in <= 300 ms at 100 hosts
and 1,000 replicas). Usage:

    python bench/bench_console.py [--hosts 100] [--replicas 1000] [--reps 5] [--database-url URL]

The store is filled with the store's own functions, the way the control plane writes it (a
whole simulated fleet placed through Temporal takes minutes at this size; the pages read only
the store): each host's hello (records.upsert_worker: 8 GPUs of 80 GiB, NUMA and NVLink pairs,
simulated), the deployments (records.save_deployment: 50 replicas each, tenants t0..t3), the
replicas created PENDING (records.create_instances), booked in the ledger (ledger.reserve_many:
10 GiB of one GPU each) and recorded RUNNING with an address (records.record_instances); the
last 10 stay PENDING with a reason. No decisions are kept (pages showing one show that none is).

Then a Temporal dev server, one control-plane worker and a real ``gpuflow gateway`` are started
over that store as ``gpuflow dev`` starts them (``--no-temporal``: the gateway alone, and pages
that ask Temporal then say they could not), and every GET route registered in
console/__init__.py at run time is asked ``--reps`` times (a path parameter is filled
with a deployment, a replica or a host of the store; the playground with ``?model=``). Per
page: the status, the server's data time (``x-gpuflow-data-ms``) p50 and max, the whole
response's time p50 and max, and whether the data max is within 300 ms. The deployments have no
workflows (they were not deployed through Temporal): what a page asks a deployment's workflow
is answered "not found", quickly. Asserts nothing."""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from contracts.control import InstanceRecord, PlacementPlan  # noqa: E402
from contracts.host import HostReport  # noqa: E402
from gpuflow.ports import server_port  # noqa: E402
from scheduler.spec import ModelSpec  # noqa: E402
from store import db, ledger, records  # noqa: E402

GiB = 2**30
TARGET_MS = 300.0
PER_DEPLOYMENT = 50
PENDING = 10
PARAM = re.compile(r"\{(\w+)(?::\w+)?\}")


def host_report(i: int) -> HostReport:
    gpus = [{"index": g, "name": "NVIDIA H100 80GB HBM3", "vram_total": 80 * GiB, "numa_node": g // 4,
             "nvlink_peers": [g ^ 1]} for g in range(8)]
    return HostReport(name=f"sim-{i}", ram_total=1024 * GiB, gpus=gpus, simulated=True, labels={"simulator": "sim"})


def spec(d: int) -> dict:
    s = {"name": f"model-{d}", "backend": "custom", "tenant": f"t{d % 4}", "source": {"local_path": f"/models/m{d}"},
         "run_command": "serve --port {port}", "resources": {"vram": 10 * GiB, "ram": GiB}}
    ModelSpec.model_validate(s)  # what gpuflow deploy would accept
    return s


def fill(engine, hosts: int, replicas: int) -> None:
    for i in range(hosts):
        records.upsert_worker(engine, host_report(i))
    deployments = -(-replicas // PER_DEPLOYMENT)
    for d in range(deployments):
        records.save_deployment(engine, f"model-{d}", spec(d), PER_DEPLOYMENT)
    names = [(f"model-{k // PER_DEPLOYMENT}", f"model-{k // PER_DEPLOYMENT}-{k % PER_DEPLOYMENT}")
             for k in range(replicas)]
    records.create_instances(engine, [InstanceRecord(name=n, deployment=d, model=d, state="pending") for d, n in names])
    placed = names[:replicas - PENDING]
    bookings, running = [], []
    for k, (d, n) in enumerate(placed):
        w, g = f"sim-{k % hosts}", (k // hosts) % 8
        bookings.append(ledger.Booking(n, PlacementPlan(worker=w, gpu_indexes=[g], claim={"vram": {g: 10 * GiB},
                                                                                             "ram": GiB})))
        running.append(InstanceRecord(name=n, deployment=d, model=d, state="running", worker=w, gpu_indexes=[g],
                                      address="127.0.0.1", port=20000 + k, pid=100000 + k))
    for i in range(0, len(bookings), 200):
        out = ledger.reserve_many(engine, bookings[i:i + 200])
        bad = [o for o in out if isinstance(o, Exception)]
        assert not bad, bad[:3]
    records.record_instances(engine, running, check_launch=False)  # no agent launched these
    records.record_instances(engine, [InstanceRecord(
        name=n, deployment=d, model=d, state="pending",
        reason="0/100 hosts fit: every GPU lacks 10.0 GiB (bench)") for d, n in names[len(placed):]])


def routes() -> list[str]:
    """Every GET path the console registers now (console/__init__.py's PAGES)."""
    import console

    out = []
    for page in console.PAGES:
        for path, _, methods in page.ROUTES:
            if "GET" in methods:
                out.append(console.PREFIX + path)
    return out


def filled(path: str, deployment: str, replica: str, host: str) -> str:
    """``path`` with each parameter given a name of the store: by the parameter's name, else the
    segment before it (/hosts/{name} -> a host)."""
    def one(m: re.Match) -> str:
        before = path[:m.start()].rstrip("/").rsplit("/", 1)[-1]
        for word in (m.group(1), before):
            if re.search(r"host|worker", word):
                return host
            if re.search(r"replica|instance|decision", word):
                return replica
            if re.search(r"deployment|model", word):
                return deployment
        return deployment
    return PARAM.sub(lambda m: urllib.parse.quote(one(m), safe=""), path)


def get(url: str) -> tuple[int, float | None, float]:
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            r.read()
            status, data = r.status, r.headers.get("x-gpuflow-data-ms")
    except urllib.error.HTTPError as e:
        e.read()
        status, data = e.code, e.headers.get("x-gpuflow-data-ms")
    return status, (float(data) if data else None), (time.perf_counter() - t0) * 1000


def wait_up(base: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=2) as r:
                if r.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            pass
        time.sleep(0.3)
    raise SystemExit("the gateway did not answer /healthz")


def serve(a, tmp: str):
    """The store's URL, the console's base URL and what to stop: a Temporal dev server, one
    control-plane worker and ``gpuflow gateway`` over the store, as ``gpuflow dev`` starts them
    (gpuflow/dev Stack); with --no-temporal the gateway alone (pages that ask Temporal then say so)."""
    from gpuflow.dev import Stack
    from gpuflow.ports import server_port

    stack = Stack(os.path.join(tmp, "gpuflow"), port=server_port(), ui_port=None, database_url=a.database_url)
    engine = db.make_engine(stack.database_url)
    db.init_db(engine)
    t0 = time.perf_counter()
    fill(engine, a.hosts, a.replicas)
    print(f"store: {a.hosts} hosts x 8 GPUs, {a.replicas} replicas ({a.replicas - PENDING} RUNNING, {PENDING} PENDING) "
          f"in {-(-a.replicas // PER_DEPLOYMENT)} deployments, filled in {time.perf_counter() - t0:.1f} s")
    port = server_port()
    if a.no_temporal:
        p = subprocess.Popen([sys.executable, "-m", "gpuflow", "gateway", "--database-url", stack.database_url,
                              "--listen", f"127.0.0.1:{port}", "--address", "127.0.0.1:1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        return f"http://127.0.0.1:{port}", lambda: (p.terminate(), p.wait(15))
    stack.start_temporal()
    stack.start_server()
    stack.start_gateway(port)
    print("Temporal dev server, one control-plane worker and the gateway over that store")
    return f"http://127.0.0.1:{port}", stack.stop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=100)
    ap.add_argument("--replicas", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--database-url", help="a store to fill (default: a SQLite file in a temporary directory)")
    ap.add_argument("--no-temporal", action="store_true", help="the gateway alone, no Temporal nor control plane")
    a = ap.parse_args()
    base, stop = serve(a, tempfile.mkdtemp(prefix="gpuflow-bench-console-"))
    try:
        wait_up(base)
        last = a.replicas - PENDING - 1
        names = (f"model-{last // PER_DEPLOYMENT}", f"model-{last // PER_DEPLOYMENT}-{last % PER_DEPLOYMENT}",
                 f"sim-{a.hosts - 1}")
        print(f"{'page':<44} {'status':>6} {'data p50':>9} {'data max':>9} {'whole p50':>10} {'whole max':>10}  "
              f"(ms; target: data <= {TARGET_MS:.0f})")
        for path in routes():
            target = filled(path, *names) + ("?model=" + names[0] if path.endswith("/playground") else "")
            rows = [get(base + target) for _ in range(a.reps)]
            data = [d for _, d, _ in rows if d is not None]
            whole = [w for _, _, w in rows]
            status = ",".join(sorted({str(s) for s, _, _ in rows}))
            verdict = "" if not data else ("ok" if max(data) <= TARGET_MS else "OVER")
            dp50 = f"{statistics.median(data):9.1f}" if data else f"{'-':>9}"
            dmax = f"{max(data):9.1f}" if data else f"{'-':>9}"
            print(f"{target[:44]:<44} {status:>6} {dp50} {dmax} {statistics.median(whole):10.1f} {max(whole):10.1f}  "
                  f"{verdict}", flush=True)
    finally:
        stop()


if __name__ == "__main__":
    main()
