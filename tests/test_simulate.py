"""``gpuflow simulate`` at 10 hosts against a real stack (Temporal dev server, a control-plane
worker, the store): deploy, scale, a simulated host vanishes and its replicas move, delete,
Ctrl-C. Nothing is forked by the simulator: its servers are sockets in its own process."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import urllib.request

from sqlalchemy import update

from store import records
from store.tables import InstanceRow
from gpuflow import ops
from tests.live import FAST, Live, cli, spec, timings_env, write_inventory


def answers(port: int, path: str = "/health") -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


async def test_ten_simulated_hosts_deploy_scale_kill_delete(tmp_path):
    lv = await Live(str(tmp_path)).start({})
    data_dir = str(tmp_path / "sim")
    inv = write_inventory(str(tmp_path / "inv.yaml"), [24, 24])  # 2 GPUs of 24 GiB: 4 replicas of 10 GiB each
    sim = subprocess.Popen([sys.executable, "-m", "gpuflow", "simulate", "--hosts", "10", "--inventory", inv,
                            "--address", lv.stack.temporal.address, "--data-dir", data_dir, "--start-delay", "0.3"],
                           env={**os.environ, **timings_env(FAST), **lv.join_env()}, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        await lv.wait(lambda: sorted(w.name for w in records.workers(lv.engine) if w.state == "ready")
                      == [f"sim-{i}" for i in range(10)], 120, "10 simulated hosts READY")
        assert all(w.simulated for w in records.workers(lv.engine))
        assert cli(lv, "hosts").stdout.count("simulated") >= 10  # shown as simulated

        await ops.deploy(lv.client, spec("sd", replicas=4, vram_gib=10), FAST)  # its command is never run
        await lv.wait(lambda: list(lv.states("sd").values()) == ["running"] * 4, 120, "4 RUNNING")
        await ops.scale(lv.client, "sd", 6)
        await lv.wait(lambda: list(lv.states("sd").values()) == ["running"] * 6, 120, "6 RUNNING")
        summary = cli(lv, "status", "--summary").stdout.splitlines()
        assert "  instances: RUNNING 6" in summary and "hosts: READY 10" in summary, summary
        listed = [ln.split()[0] for ln in cli(lv, "hosts").stdout.splitlines()[1:] if ln.startswith("sim-")]
        assert listed == [f"sim-{i}" for i in range(10)]
        rows = lv.instances("sd")
        # --summary with the store at hand counts its rows instead of asking every instance: a row
        # set apart here shows it; another cluster's store (an empty one) is not believed
        t = InstanceRow.__table__
        with lv.engine.begin() as c:
            c.execute(update(t).where(t.c.name == rows[0].name).values(state="draining"))
        from_store = cli(lv, "status", "sd", "--summary", "--data-dir", lv.stack.data_dir).stdout.splitlines()
        with lv.engine.begin() as c:
            c.execute(update(t).where(t.c.name == rows[0].name).values(state="running"))
        assert "  instances: RUNNING 5, DRAINING 1" in from_store, from_store
        elsewhere = cli(lv, "status", "sd", "--summary", "--data-dir", str(tmp_path / "other")).stdout.splitlines()
        assert "  instances: RUNNING 6" in elsewhere, elsewhere
        assert all(answers(i.port) and answers(i.port, "/v1/models") for i in rows)  # real sockets answer health
        log = cli(lv, "logs", rows[0].name)
        assert log.returncode == 0 and "simulated: ready" in log.stdout, log.stderr  # read on its host, as usual

        victim = rows[0]
        r = subprocess.run([sys.executable, "-m", "gpuflow", "simulate", "--kill", victim.worker,
                            "--data-dir", data_dir], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert not answers(victim.port)  # its servers went with it

        def moved():
            i = next(x for x in lv.instances("sd") if x.name == victim.name)
            return i.state == "running" and i.worker != victim.worker

        await lv.wait(moved, 120, f"{victim.name} RUNNING on another host")
        await lv.wait(lambda: {w.name: w.state for w in records.workers(lv.engine)}[victim.worker] == "not_ready",
                      60, f"{victim.worker} NOT_READY")
        assert list(lv.states("sd").values()) == ["running"] * 6
        # gone for good: forgotten, once its replicas have moved; a READY host is refused, as a typo
        await lv.wait(lambda: victim.worker not in {w for w, _ in _lines(lv)}, 60, f"no reservation on {victim.worker}")
        ready = next(w.name for w in records.workers(lv.engine) if w.state == "ready")
        r = cli(lv, "hosts", "forget", ready)
        assert r.returncode == 2 and f"host {ready} is READY; stop its agent first" in r.stderr, r.stderr
        r = cli(lv, "hosts", "forget", "sim-99")
        assert r.returncode == 2 and "no host named 'sim-99'" in r.stderr, r.stderr
        r = cli(lv, "hosts", "forget", victim.worker)
        assert r.returncode == 0 and f"host {victim.worker} forgotten" in r.stdout, r.stderr
        assert victim.worker not in {w.name for w in records.workers(lv.engine)}
        assert victim.worker not in cli(lv, "hosts").stdout
        assert "hosts: READY 9" in cli(lv, "status", "--summary").stdout.splitlines()

        ports = [i.port for i in lv.instances("sd")]
        left: list[int] = []  # what delete --wait tells as it waits
        await asyncio.wait_for(ops.delete(lv.client, "sd", wait=True, progress=left.append, every_s=0.1), 120)
        assert left and left == sorted(left, reverse=True) and left[0] <= 6, left
        await lv.wait(lambda: lv.states("sd") == {}, 120, "sd deleted")
        await lv.wait(lambda: not any(answers(p) for p in ports), 30, "every simulated server stopped")

        bad = subprocess.run([sys.executable, "-m", "gpuflow", "simulate", "--kill", "nope", "--data-dir", data_dir],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and "not a host of the running simulator" in bad.stderr

        sim.send_signal(signal.SIGINT)
        out, _ = sim.communicate(timeout=60)
        assert sim.returncode == 0, out
        assert "sim-" in out and "vanished" in out
        assert "gpuflow simulate: stopped 9 host(s); 1 had vanished" in out, out
        assert "gpuflow simulate: all 10 hosts serve their task queues" in out and "gpuflow agent sim-" not in out, out
    finally:
        if sim.poll() is None:
            sim.kill()
            sim.wait()
        lv.close()


async def test_bad_arguments_are_named(tmp_path):
    cases = [  # (arguments, what the error names)
        (["--hosts", "0", "--inventory", "x.yaml"], "--hosts must be at least 1"),
        (["--hosts", "2", "--inventory", "x.yaml", "--fail-rate", "1.5"], "--fail-rate"),
        (["--hosts", "2", "--inventory", "x.yaml", "--name-prefix", "Bad_Name"], "--name-prefix"),
        (["--hosts", "2"], "--inventory"),
        (["--kill", "sim-0", "--data-dir", str(tmp_path)], "no simulator is running"),
    ]
    for args, what in cases:
        r = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "gpuflow", "simulate", *args],
                                    capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and what in r.stderr, (args, r.stderr)


def _lines(lv: Live) -> list[tuple[str, str]]:
    """(worker, instance) of every ledger line."""
    from sqlmodel import Session, select

    from store.tables import ReservationRow

    with Session(lv.engine) as s:
        return [(r.worker, r.instance) for r in s.exec(select(ReservationRow))]
