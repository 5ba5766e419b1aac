"""``gpuflow status`` shows each replica's VRAM used against claimed, through ``--address`` alone,
for a simulated host (``gpuflow simulate --vram-use-ratio 0.9``: 10 GiB claimed, 9.0 used) and for a
host whose NVML lists processes (the in-memory NVML of test_inventory_nvml.py, over the real
process tree the agent started: the engine 6 GiB and its child 3 GiB, then 8 + 4 = 12 GiB, over its
10 GiB claim, which status says). ``status --json``, ``explain``, the store and the agent's
metrics carry the same figures. A real stack: Temporal dev server, control plane, store."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

from prometheus_client import generate_latest

from gpuflow import ops
from scheduler.units import GiB
from store import usage
from tests.live import FAST, Live, cli, spec, timings_env, write_inventory
from tests.test_inventory_nvml import FakeNVML
from worker_agent.engines import EngineConfig
from worker_agent.memory_probe import NvmlProbe, read_procs
from worker_agent.processes import ProcessTable

T = FAST.model_copy(update={"liveness_s": 1.0})  # sample every second
# an engine that starts a child (a worker process, as vLLM's are) and serves HTTP
CHILD = ("import subprocess, sys, runpy; subprocess.Popen(['sleep', '600']); "
         "sys.argv = ['http.server', '{port}', '--bind', '{host}']; runpy.run_module('http.server', run_name='__main__')")
COMMAND = f'{sys.executable} -c "{CHILD}"'


class TreeNVML(FakeNVML):
    """One 24 GiB card whose process list holds the table's processes: each leader ``leader``
    bytes, each of its children ``child`` bytes (found in /proc by parent pid)."""

    def __init__(self, table: ProcessTable):
        super().__init__([{"name": "NVIDIA L4", "total": 24 * GiB, "used": 0}])
        self.table, self.leader, self.child = table, 6 * GiB, 3 * GiB

    def nvmlDeviceGetComputeRunningProcesses(self, h):  # noqa: N802
        from types import SimpleNamespace

        procs = read_procs()
        out = []
        for rec in self.table.records():
            out.append(SimpleNamespace(pid=rec.pid, usedGpuMemory=self.leader))
            out += [SimpleNamespace(pid=p, usedGpuMemory=self.child) for p, i in procs.items() if i.ppid == rec.pid]
        return out


def row(st: dict, deployment: str) -> dict:
    return next(d for d in st["deployments"] if d["name"] == deployment)["instances"][0]


async def test_status_shows_vram_used_against_claimed_for_simulated_and_nvml_hosts(tmp_path):
    from worker_agent.agent import run_agent

    lv = await Live(str(tmp_path), t=T).start({})
    inv = write_inventory(str(tmp_path / "inv.yaml"), [24])
    sim = subprocess.Popen([sys.executable, "-m", "gpuflow", "simulate", "--hosts", "1", "--inventory", inv,
                            "--address", lv.stack.temporal.address, "--data-dir", str(tmp_path / "sim"),
                            "--start-delay", "0.2", "--vram-use-ratio", "0.9"],
                           env={**os.environ, **timings_env(T), **lv.join_env()}, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    table = ProcessTable(str(tmp_path / "nv" / "agent"))
    nvml, stop, registries = TreeNVML(table), asyncio.Event(), []
    agent = asyncio.ensure_future(run_agent(
        lv.client, "gpu-a", str(tmp_path / "nv"), T, inventory_file=inv, labels={"kind": "nvml"}, stop=stop,
        engines=EngineConfig(allow_custom=True), table=table, memory_probe=NvmlProbe(nvml),
        serve_metrics=lambda registry, extra: registries.append(registry), serving=lambda line: None,
        join_token=lv.stack.join_token()))
    try:
        await wait_hosts(lv)
        await ops.deploy(lv.client, spec("sv", vram_gib=10, worker_selector={"simulator": "sim"}), T)
        await ops.deploy(lv.client, spec("nv", vram_gib=10, worker_selector={"kind": "nvml"}, command=COMMAND), T)
        await lv.wait(lambda: lv.states("sv") == {"sv-0": "running"} and lv.states("nv") == {"nv-0": "running"}, 120,
                      "both replicas RUNNING")

        # 10 GiB x 0.9 = 9.0 GiB simulated; 6 GiB (the engine) + 3 GiB (its child) = 9.0 GiB through NVML
        await until(lambda: acli(lv, "status"), lambda out: out.count("9.0/10.0 GiB") == 2, "9.0/10.0 GiB twice")
        st = json.loads((await acli(lv, "status", "--json")))
        sv, nv = row(st, "sv"), row(st, "nv")
        assert (sv["vram"]["used"], sv["vram"]["claimed"], sv["vram"]["measured"]) == (int(10 * GiB * 0.9), 10 * GiB,
                                                                                     "simulated")
        assert (nv["vram"]["used"], nv["vram"]["claimed"], nv["vram"]["measured"]) == (9 * GiB, 10 * GiB, "nvml")
        assert nv["vram"]["rss"] > 0 and not nv["vram"]["over"]
        one = (await acli(lv, "status", "nv"))  # one deployment: its host is asked for it
        assert "9.0/10.0 GiB" in one, one

        # the engine grows to 8 + 4 = 12 GiB, past its 10 GiB claim: status says so
        nvml.leader, nvml.child = 8 * GiB, 4 * GiB
        out = await until(lambda: acli(lv, "status"), lambda o: "12.0/10.0 GiB" in o, "12.0/10.0 GiB")
        print(out, explained := (await acli(lv, "explain", "nv-0")), sep="\n")  # shown with pytest -s
        line = next(ln for ln in out.splitlines() if ln.strip().startswith("nv-0 "))
        assert "VRAM over its claim: 12.0 GiB used of 10.0 GiB claimed" in line, out
        assert "memory measured (NVML per process): VRAM 12.0/10.0 GiB, peak 12.0 GiB" in explained, explained
        assert "gpu-a: GPU 0 12.00 (peak 12.00) of 10.00 GiB" in explained, explained

        # the store keeps the latest and the peak, per replica and per (source, backend, parameters, GPU model)
        await lv.wait(lambda: [r.vram_peak for r in usage.of_instance(lv.engine, "nv-0")] == [12 * GiB], 30,
                      "the store's peak at 12 GiB")
        profiles = {p.instance: p for p in usage.profiles(lv.engine)}
        assert (profiles["nv-0"].backend, profiles["nv-0"].gpu_model, profiles["nv-0"].source) == (
            "custom", "Simulated 24G", "/models/nv")  # the GPU model as the inventory names it
        assert profiles["sv-0"].vram_latest == int(10 * GiB * 0.9)

        text = generate_latest(registries[0]).decode()
        assert 'gpuflow_instance_vram_used_bytes{gpu="0",host="gpu-a",instance="nv-0"} 1.2884901888e+10' in text, text
        assert 'gpuflow_instance_vram_claimed_bytes{gpu="0",host="gpu-a",instance="nv-0"} 1.073741824e+10' in text
    finally:
        stop.set()
        try:
            await asyncio.wait_for(agent, 30)
        except BaseException:  # noqa: BLE001
            agent.cancel()
        for rec in table.records():
            await table.stop(rec.instance, 2)
        sim.send_signal(2)
        try:
            sim.wait(30)
        except subprocess.TimeoutExpired:
            sim.kill()
        lv.close()


async def wait_hosts(lv: Live) -> None:
    from store import records

    await lv.wait(lambda: sorted(w.name for w in records.workers(lv.engine) if w.state == "ready") == ["gpu-a", "sim-0"],
                  120, "both hosts READY")


async def acli(lv: Live, *args: str) -> str:
    """The CLI's output, run off the event loop: the agent under test serves on this loop, and a
    blocked loop would miss its heartbeats."""
    return (await asyncio.to_thread(cli, lv, *args)).stdout


async def until(get, ok, what: str, timeout: float = 60.0):
    """``await get()`` until ``ok`` holds of it (the agent samples every second; the watch carries news)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        got = await get()
        if ok(got):
            return got
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last:\n{got}")
        await asyncio.sleep(1.0)
