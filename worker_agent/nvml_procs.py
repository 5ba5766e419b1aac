"""NVML's per-process view of each card, with nothing but the standard library: the seam the
inventory (worker_agent/inventory.py: ``vram_foreign``), the memory probe (memory_probe.py) and
bench/gpu_foreign_memory.py (run on a GPU host without gpuflow installed) share.

``split`` is the arithmetic of "memory gpuflow does not own": per card, NVML's used, the part
held by gpuflow's processes (those ``ours`` says it started, and their trees), and the rest,
held by processes it did not start: foreign = the per-process sum of the others. Where the driver
lists no processes (some vGPU and MIG setups) foreign is unknown (None), never guessed from used."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable


@contextmanager
def nvml_session(nvml=None):
    """NVML initialised for the block, shut down after: yields the module (``pynvml`` by
    default, an in-memory fake in tests), or None when there is no library or no driver."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            yield None
            return
    try:
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001  NVMLError_LibraryNotFound, DriverNotLoaded, ...
        yield None
        return
    try:
        yield nvml
    finally:
        nvml.nvmlShutdown()


def gpu_processes(nv, h) -> dict[int, int | None] | None:
    """pid -> bytes it holds on the card (None: NVML cannot say), compute and graphics; None when
    the driver lists no processes at all (not supported)."""
    out: dict[int, int | None] = {}
    listed = False
    for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        get = getattr(nv, fn, None)
        if get is None:
            continue
        try:
            procs = get(h)
        except Exception:  # noqa: BLE001  NVMLError_NotSupported, ...
            continue
        listed = True
        for p in procs:
            mem = getattr(p, "usedGpuMemory", None)
            prev = out.get(p.pid)
            out[p.pid] = mem if prev is None else max(prev, mem or 0)
    return out if listed else None


@dataclass(frozen=True)
class CardUse:
    index: int
    total: int
    used: int  # NVML's used (every process, and the driver's own)
    ours: int | None  # held by gpuflow's processes; None: the driver lists no processes
    foreign: int | None  # held by the other processes; None: the driver lists no processes


def split(nv, ours: Callable[[int], bool]) -> list[CardUse]:
    """Each card's use in an open NVML session ``nv``, split by who holds it (``ours(pid)``)."""
    out = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        procs = gpu_processes(nv, h)
        if procs is None:
            out.append(CardUse(i, mem.total, mem.used, None, None))
            continue
        mine = sum(b or 0 for pid, b in procs.items() if ours(pid))
        out.append(CardUse(i, mem.total, mem.used, mine, sum(b or 0 for pid, b in procs.items() if not ours(pid))))
    return out
