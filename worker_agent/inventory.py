"""What this host has: NVML's GPUs when the driver answers; otherwise an inventory file of
simulated GPUs (labelled ``simulated`` everywhere it is shown); otherwise CPU only."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Callable

import yaml
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from contracts.host import MAX_KV_CONNECTORS, HostReport, known_kv_connectors
from scheduler.bounds import Labels
from scheduler.cluster import GPU, Bytes, GPUList
from scheduler.errors import InvalidInput
from worker_agent import nvml_topology


class InventoryFile(BaseModel):
    """The simulated inventory file (YAML or JSON): the host's fields from the cluster snapshot
    format, without a name (the agent's --name gives it)."""

    model_config = ConfigDict(extra="forbid")
    cluster: str = "default"
    labels: Labels = {}
    ram_total: Bytes
    unified_memory: bool = False
    reserved: dict[Literal["ram", "vram"], Bytes] = {}
    backends: list[str] | None = Field(None, max_length=64)
    # the KV connectors this host's engines can run, stated (worker_agent/kv_connectors.py); None: found
    kv_connectors: list[str] | None = Field(None, max_length=MAX_KV_CONNECTORS)
    gpus: GPUList = []

    @field_validator("kv_connectors")
    @classmethod
    def _known(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else known_kv_connectors(v)


_PARSED: dict[str, tuple[tuple, "InventoryFile"]] = {}  # path -> (its stat when parsed, the parse)


def _read(path: str) -> "InventoryFile":
    """The inventory file, parsed again only when it changed (its size, mtime or inode): the host's
    watch reads it every few seconds, and YAML costs about 10 ms here (a fleet simulator of 100
    hosts spent most of a core on it)."""
    st = os.stat(path)
    key = (st.st_ino, st.st_size, st.st_mtime_ns)
    hit = _PARSED.get(path)
    if hit is None or hit[0] != key:
        with open(path) as f:
            raw = yaml.safe_load(f)
        if len(_PARSED) > 64:
            _PARSED.clear()
        hit = _PARSED[path] = (key, InventoryFile.model_validate(raw or {}))
    return hit[1].model_copy(deep=True)  # a report of its own: nothing shared with the cache or other reports


def from_file(name: str, path: str) -> HostReport:
    try:
        inv = _read(path)
    except OSError as e:
        raise InvalidInput(f"inventory file {path}: {e.strerror}") from None
    except (yaml.YAMLError, ValueError) as e:
        raise InvalidInput(f"inventory file {path}: {e}") from None
    return HostReport(name=name, cluster=inv.cluster, labels=inv.labels, ram_total=inv.ram_total,
                      unified_memory=inv.unified_memory, reserved_ram=inv.reserved.get("ram", 0),
                      reserved_vram=inv.reserved.get("vram", 0), backends=inv.backends, gpus=inv.gpus,
                      simulated=True, kv_connectors=inv.kv_connectors)


def host_ram() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


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


def from_nvml(nvml=None, owner: Callable[[], Callable[[int], bool]] | None = None) -> list[GPU] | None:
    """The host's NVIDIA GPUs, or None when NVML is not there (no library, no driver).
    ``vram_used`` is everything in use on the card; ``vram_foreign`` the part held by processes
    gpuflow did not start (``owner()``, asked once per discovery, says which it did). The
    scheduler counts max(claims + foreign, used), so memory someone else holds is never offered."""
    with nvml_session(nvml) as nv:
        if nv is None:
            return None
        ours = owner() if owner else (lambda pid: False)
        gpus, handles = [], []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            handles.append(h)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            procs = gpu_processes(nv, h)
            foreign = None if procs is None else _bucket(sum(b or 0 for pid, b in procs.items() if not ours(pid)))
            gpus.append(GPU(index=i, vendor="nvidia", type="cuda", name=_text(nv.nvmlDeviceGetName(h)),
                            uuid=_text(nv.nvmlDeviceGetUUID(h)), vram_total=mem.total, vram_used=_bucket(mem.used),
                            vram_foreign=foreign))
        return nvml_topology.annotate(nv, handles, gpus, cache=nvml is None)  # the real driver's answers keep


def gpu_health(nvml=None) -> dict[int, tuple[float, float]]:
    """GPU index -> (utilization %, temperature C) from NVML; empty without NVML. Read at scrape
    time for metrics, not part of the inventory (it changes every second)."""
    with nvml_session(nvml) as nv:
        if nv is None:
            return {}
        out = {}
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            util = nv.nvmlDeviceGetUtilizationRates(h).gpu
            temp = nv.nvmlDeviceGetTemperature(h, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
            out[i] = (float(util), float(temp))
        return out


def discover(name: str, inventory_file: str | None = None, labels: dict[str, str] | None = None,
             nvml=None, owner: Callable[[], Callable[[int], bool]] | None = None) -> HostReport:
    if inventory_file:
        r = from_file(name, inventory_file)
    else:
        gpus = from_nvml(nvml, owner) or []
        r = HostReport(name=name, ram_total=host_ram(), gpus=gpus)
    if labels:
        r = r.model_copy(update={"labels": {**r.labels, **labels}})
    return r


def _bucket(used: int, step: int = 256 * 2**20) -> int:
    """Observed use rounded up to 256 MiB, so allocator noise does not count as an inventory change."""
    return -(-used // step) * step
