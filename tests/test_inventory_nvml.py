"""GPU discovery through the NVML seam, with an in-memory NVML: names, memory, and memory used
by others kept from the scheduler; no library or no driver means CPU only."""

from __future__ import annotations

import asyncio
import os
import sys
from contextlib import asynccontextmanager
from types import SimpleNamespace

from contracts.control import HostReport
from worker_agent.processes import ProcessTable
from scheduler.allocatable import allocatable
from scheduler.cluster import Worker
from scheduler.units import GiB, MiB
from worker_agent.inventory import discover, from_nvml


class FakeNVML:
    """The handful of pynvml calls the agent makes, over a list of cards."""

    def __init__(self, cards, fail_init: Exception | None = None):
        self.cards, self.fail_init, self.open = cards, fail_init, 0

    def nvmlInit(self):  # noqa: N802
        if self.fail_init:
            raise self.fail_init
        self.open += 1

    def nvmlShutdown(self):  # noqa: N802
        self.open -= 1

    def nvmlDeviceGetCount(self):  # noqa: N802
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return self.cards[i]

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802
        return SimpleNamespace(total=h["total"], used=h["used"], free=h["total"] - h["used"])

    def nvmlDeviceGetName(self, h):  # noqa: N802
        return h["name"]

    def nvmlDeviceGetUUID(self, h):  # noqa: N802
        return h.get("uuid", b"GPU-00000000-0000-0000-0000-000000000000")

    def nvmlDeviceGetUtilizationRates(self, h):  # noqa: N802
        return SimpleNamespace(gpu=h.get("util", 0), memory=0)

    def nvmlDeviceGetTemperature(self, h, sensor):  # noqa: N802
        return h.get("temp", 40)

    def nvmlDeviceGetComputeRunningProcesses(self, h):  # noqa: N802
        if "procs" not in h:
            raise RuntimeError("NVMLError_NotSupported")
        return [SimpleNamespace(pid=pid, usedGpuMemory=b) for pid, b in h["procs"]]


def test_cards_are_reported_and_the_library_closed():
    nvml = FakeNVML([{"name": b"NVIDIA H100 80GB HBM3", "total": 80 * GiB, "used": 600 * MiB,
                      "uuid": b"GPU-5d1b4c2e-8d0f-4f63-9c1a-2b7e0a9f1c11"},
                     {"name": "NVIDIA H100 80GB HBM3", "total": 80 * GiB, "used": 0,
                      "uuid": "GPU-9a0c7e55-1e2b-4b8f-a3d4-6c5b4a3f2e10"}])
    gpus = from_nvml(nvml)
    assert [(g.index, g.name, g.uuid, g.vram_total, g.vram_used) for g in gpus] == [
        (0, "NVIDIA H100 80GB HBM3", "GPU-5d1b4c2e-8d0f-4f63-9c1a-2b7e0a9f1c11", 80 * GiB,
         768 * MiB),  # 600 MiB rounded up to 256 MiB steps: 3 x 256
        (1, "NVIDIA H100 80GB HBM3", "GPU-9a0c7e55-1e2b-4b8f-a3d4-6c5b4a3f2e10", 80 * GiB, 0)]
    assert nvml.open == 0


def test_memory_used_by_others_is_not_offered():
    """A foreign process holds 30 GiB of card 0: 80 - 30 = 50 GiB is what the scheduler sees."""
    nvml = FakeNVML([{"name": "H100", "total": 80 * GiB, "used": 30 * GiB}])
    r = discover("g1", nvml=nvml)
    w = Worker(name=r.name, ram_total=r.ram_total, gpus=r.gpus)
    assert allocatable(w, None).vram == {0: 50 * GiB}
    assert isinstance(r, HostReport) and not r.simulated


@asynccontextmanager
async def engine_with_child(table: ProcessTable, instance: str):
    """A real engine started by the agent's process table that starts a child of its own (a
    ``sleep``): (its record, the child's pid, which the engine prints); stopped at the end."""
    code = "import subprocess, time; c = subprocess.Popen(['sleep', '60']); print(c.pid, flush=True); time.sleep(60)"
    rec = table.start(instance, [sys.executable, "-c", code], {}, None)
    try:
        for _ in range(100):
            text = open(table.log_path(instance)).read().split("\n", 1)[1].strip()
            if text:
                break
            await asyncio.sleep(0.05)
        yield rec, int(text)
    finally:
        await table.stop(instance, 2)


async def test_memory_of_processes_gpuflow_did_not_start_is_reported(tmp_path):
    """Card 0: our engine (a real process started by the agent's table, 10 GiB, and its child,
    2 GiB) and a stranger (this test's own pid, 5 GiB; 700 MiB more on card 1). Foreign: 5 GiB
    and 768 MiB (700 rounded up to 256 MiB steps). With our 12 GiB claim the scheduler offers
    80 - max(12 + 5, 17 used) = 63 GiB of card 0."""
    table = ProcessTable(str(tmp_path))
    async with engine_with_child(table, "m-0") as (rec, child):
        assert table.owns(rec.pid) and table.owns(child) and not table.owns(os.getpid())
        nvml = FakeNVML([{"name": "H100", "total": 80 * GiB, "used": 17 * GiB,
                          "procs": [(rec.pid, 10 * GiB), (child, 2 * GiB), (os.getpid(), 5 * GiB)]},
                         {"name": "H100", "total": 80 * GiB, "used": 700 * MiB, "procs": [(os.getpid(), 700 * MiB)]},
                         {"name": "H100", "total": 80 * GiB, "used": 0}])  # lists no processes: unknown
        r = discover("g1", nvml=nvml, owner=table.owner)
        assert [g.vram_foreign for g in r.gpus] == [5 * GiB, 768 * MiB, None]
        w = Worker(name="g1", ram_total=r.ram_total, gpus=r.gpus)
        from scheduler.allocatable import Allocated

        assert allocatable(w, Allocated(vram={0: 12 * GiB})).vram[0] == 63 * GiB


def test_no_library_or_driver_means_cpu_only():
    class NVMLError_DriverNotLoaded(Exception):  # noqa: N801  (pynvml's own naming)
        pass

    assert from_nvml(FakeNVML([], fail_init=NVMLError_DriverNotLoaded())) is None
    r = discover("laptop", nvml=FakeNVML([], fail_init=NVMLError_DriverNotLoaded()))
    assert r.gpus == [] and r.ram_total > 0


def test_utilization_and_temperature_reach_the_agent_metrics(tmp_path):
    from prometheus_client import generate_latest

    from worker_agent.inventory import gpu_health
    from worker_agent.metrics import AgentMetrics
    from worker_agent.processes import ProcessTable

    nvml = FakeNVML([{"name": "H100", "total": 80 * GiB, "used": 0, "util": 87, "temp": 71},
                     {"name": "H100", "total": 80 * GiB, "used": 0, "util": 3, "temp": 35}])
    assert gpu_health(nvml) == {0: (87.0, 71.0), 1: (3.0, 35.0)}
    m = AgentMetrics("g1", lambda: discover("g1", nvml=nvml), ProcessTable(str(tmp_path)), health=lambda: gpu_health(nvml))
    text = generate_latest(m.registry).decode()
    assert 'gpuflow_agent_gpu_utilization_percent{gpu="0",host="g1"} 87.0' in text
    assert 'gpuflow_agent_gpu_temperature_celsius{gpu="1",host="g1"} 35.0' in text
    assert 'gpuflow_agent_gpu_vram_total_bytes{gpu="1",host="g1",simulated="false"} 8.589934592e+10' in text
    assert gpu_health(FakeNVML([], fail_init=RuntimeError("no driver"))) == {}
