"""Two kinds of host, live (issue 36): a host of mock GPUs whose engines are real processes (the
demo's, the tests': ``gpuflow agent --inventory``) and ``gpuflow simulate``'s, which starts nothing.
The README's simulate example (``run_command: my-server --port {port}``) went ERROR on the demo's
hosts ("cannot start 'my-server'"): the placement now keeps it off a host whose agent has no such
command, PENDING with a reason naming the host and the command, and places it on a simulated host
once one joins. ``gpuflow hosts`` names each kind, and says what the words mean. On a clean exit
simulate's hosts leave the cluster (they stayed NOT_READY until ``gpuflow hosts forget``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from gpuflow import ops
from store import records
from tests.live import FAST, Live, cli, spec, timings_env, write_inventory


async def test_a_command_no_host_has_waits_pending_and_goes_to_a_simulated_host(tmp_path):
    lv = await Live(str(tmp_path)).start({"box": [24]})
    sim = None
    try:
        await ops.deploy(lv.client, spec("mine", vram_gib=10, command="my-server --port {port}"), FAST)
        want = ("unschedulable: 'my-server' is on the PATH of no host of box; command: worker box: cannot start "
                "'my-server': no such command on the host's PATH")
        await lv.wait(lambda: [(i.state, i.reason) for i in lv.instances("mine")] == [("pending", want)], 60,
                      "mine-0 PENDING, naming the host and the command")
        status = cli(lv, "status", "mine").stdout
        assert "cannot start 'my-server'" in status and "ERROR" not in status, status

        inv = write_inventory(str(tmp_path / "sim.yaml"), [24])
        sim = subprocess.Popen([sys.executable, "-m", "gpuflow", "simulate", "--hosts", "1", "--inventory", inv,
                                "--address", lv.stack.temporal.address, "--data-dir", str(tmp_path / "sim"),
                                "--start-delay", "0.2"], env={**os.environ, **timings_env(FAST), **lv.join_env()},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        await lv.wait(lambda: [(i.state, i.worker) for i in lv.instances("mine")] == [("running", "sim-0")], 120,
                      "mine-0 RUNNING on the simulated host (nothing runs there, any command does)")
        listed = {ln.split()[0]: ln.split()[2] for ln in cli(lv, "hosts").stdout.splitlines()
                  if ln.startswith(("box ", "sim-0 "))}
        assert listed == {"box": "mock-gpus", "sim-0": "simulated"}
        legend = cli(lv, "hosts").stdout
        assert "mock-gpus: GPUs from an inventory file; engines run as real processes" in legend
        assert "simulated: gpuflow simulate's: GPUs from an inventory file, and nothing runs" in legend
        rows = {w.name: (w.runs, bool(w.commands)) for w in records.workers(lv.engine)}
        assert rows == {"box": ("processes", True), "sim-0": ("nothing", False)}

        # a clean exit: simulate's hosts leave (they stayed NOT_READY until 'gpuflow hosts forget');
        # sim-0 holds mine-0, so it goes once mine-0 is placed elsewhere (here: nowhere, PENDING again)
        sim.send_signal(signal.SIGINT)
        out, _ = sim.communicate(timeout=120)
        assert sim.returncode == 0 and "host(s) left the cluster" in out, out
        await lv.wait(lambda: [w.name for w in records.workers(lv.engine)] == ["box"], 90, "sim-0 forgotten")
        await lv.wait(lambda: [(i.state, i.reason) for i in lv.instances("mine")] == [("pending", want)], 60,
                      "mine-0 PENDING again, for the same reason")
        assert "sim-0" not in cli(lv, "hosts").stdout
    finally:
        if sim is not None and sim.poll() is None:
            sim.send_signal(signal.SIGINT)
            try:
                sim.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                sim.kill()
                sim.wait()
        lv.close()
