"""What this host has: NVML's GPUs when the driver answers; otherwise an inventory file of
simulated GPUs (labelled ``simulated`` everywhere it is shown); otherwise CPU only."""

from __future__ import annotations

import os
from typing import Callable

import yaml
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from contracts.host import MAX_KV_CONNECTORS, ForeignDegraded, HostReport, known_kv_connectors
from scheduler.bounds import Labels
from scheduler.cluster import GPU, Bytes, check_gpus
from scheduler.limits import MAX_GPUS
from scheduler.errors import InvalidInput
from scheduler.foreign import degradations
from worker_agent import nvml_topology
from worker_agent.nvml_procs import nvml_session, split


class InventoryGPU(GPU):
    """A simulated GPU: the snapshot's GPU fields, and ``vram_used_by_others``, the memory that
    processes gpuflow did not start hold on it (reported as ``vram_foreign``; the scheduler books
    around it, scheduler/foreign.py). Editing it in the file while the agent runs rehearses a
    foreign process that grows."""

    vram_used_by_others: Bytes | None = None

    @model_validator(mode="after")
    def _one_name(self) -> "InventoryGPU":
        if self.vram_used_by_others is not None and self.vram_foreign is not None:
            raise ValueError(f"GPU {self.index}: give vram_used_by_others or vram_foreign, not both")
        if (self.vram_used_by_others or 0) > self.vram_total:
            raise ValueError(f"GPU {self.index}: vram_used_by_others ({self.vram_used_by_others} bytes) is more "
                             f"than its vram_total ({self.vram_total} bytes)")
        return self

    def gpu(self) -> GPU:
        """The GPU as the host reports it: its foreign use under the snapshot's name."""
        fields = self.model_dump(exclude={"vram_used_by_others"})
        if self.vram_used_by_others is not None:
            fields["vram_foreign"] = self.vram_used_by_others
        return GPU.model_validate(fields)


InventoryGPUList = Annotated[list[InventoryGPU], Field(max_length=MAX_GPUS), AfterValidator(check_gpus)]


def free_for_gpuflow(gpu: GPU, reserved_vram: int = 0) -> int:
    """What gpuflow's processes can hold on ``gpu`` before the card is full: its total less the
    host's reserve and what other processes hold (``vram_foreign``; a simulated GPU's
    ``vram_used_by_others``). A simulated host's out-of-memory judge compares its replicas' use
    with this."""
    return max(gpu.vram_total - reserved_vram - (gpu.vram_foreign or 0), 0)


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
    gpus: InventoryGPUList = []

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
                      reserved_vram=inv.reserved.get("vram", 0), backends=inv.backends, gpus=[g.gpu() for g in inv.gpus],
                      simulated=True, kv_connectors=inv.kv_connectors)


def host_ram() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def from_nvml(nvml=None, owner: Callable[[], Callable[[int], bool]] | None = None) -> list[GPU] | None:
    """The host's NVIDIA GPUs, or None when NVML is not there (no library, no driver).
    ``vram_used`` is everything in use on the card; ``vram_foreign`` the part held by processes
    gpuflow did not start (``owner()``, asked once per discovery, says which it did). The
    scheduler counts max(claims + foreign, used), so memory someone else holds is never offered."""
    with nvml_session(nvml) as nv:
        if nv is None:
            return None
        uses = split(nv, owner() if owner else (lambda pid: False))
        handles = [nv.nvmlDeviceGetHandleByIndex(u.index) for u in uses]
        gpus = [GPU(index=u.index, vendor="nvidia", type="cuda", name=_text(nv.nvmlDeviceGetName(h)),
                    uuid=_text(nv.nvmlDeviceGetUUID(h)), vram_total=u.total, vram_used=_bucket(u.used),
                    vram_foreign=None if u.foreign is None else _bucket(u.foreign)) for u, h in zip(uses, handles)]
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


def judged(report: HostReport, booked: dict[int, int]) -> HostReport:
    """``report`` with the cards whose foreign use grew past the room ``booked`` (GPU index ->
    bytes gpuflow's bookings hold here) leaves (scheduler/foreign.py); None when there is none."""
    found = degradations(report.gpus, report.reserved_vram, booked)
    if not found and report.foreign_degraded is None:
        return report
    return report.model_copy(update={"foreign_degraded": [ForeignDegraded(index=d.index, foreign=d.foreign,
                                                                          booked=d.booked, room=d.room)
                                                          for d in found] or None})


def booked_here(requests) -> dict[int, int]:
    """GPU index -> the claims the agent's usage book holds for its servers (the ledger's, per
    booking; helpers carry none)."""
    out: dict[int, int] = {}
    for r in requests:
        for i, b in (r.vram_claim or {}).items():
            out[i] = out.get(i, 0) + b
    return out
