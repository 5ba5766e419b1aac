"""The cluster snapshot: workers with their GPUs, placed instances with their claims, and which
model files each worker holds. Documented in docs/formats.md (format version 1).

Byte fields take integers or strings with a unit ("24 GiB", "512MiB", "16GB").
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(v: Any) -> Any:
    """'24 GiB' -> 25769803776; ints pass through; anything else is left for pydantic to reject."""
    if isinstance(v, str):
        m = _SIZE.match(v)
        if not m or m[2].lower() not in _UNITS:
            raise ValueError(f"{v!r} is not a byte size (examples: 1073741824, '24 GiB', '512MiB')")
        return int(float(m[1]) * _UNITS[m[2].lower()])
    return v


Bytes = Annotated[int, BeforeValidator(parse_bytes), Field(ge=0)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorkerState(str, Enum):
    READY = "ready"
    NOT_READY = "not_ready"
    UNREACHABLE = "unreachable"
    MAINTENANCE = "maintenance"


class InstanceState(str, Enum):
    PENDING = "pending"
    ANALYZING = "analyzing"
    SCHEDULED = "scheduled"
    INITIALIZING = "initializing"
    DOWNLOADING = "downloading"
    STARTING = "starting"
    RUNNING = "running"
    ERROR = "error"
    UNREACHABLE = "unreachable"
    STOPPING = "stopping"


class FileState(str, Enum):
    READY = "ready"
    DOWNLOADING = "downloading"
    ERROR = "error"


class Reserved(Strict):
    ram: Bytes = 0
    vram: Bytes = 0  # reserved on each GPU


class GPU(Strict):
    index: int = Field(ge=0)
    vendor: str = "nvidia"
    type: str = "cuda"
    name: str = ""
    uuid: str | None = None  # NVML's GPU-... id, stable across reboots and reorderings
    vram_total: Bytes
    vram_used: Bytes | None = None  # observed use, ours and others'
    vram_foreign: Bytes | None = None  # held by processes gpuflow did not start (NVML's per-process list)


class Worker(Strict):
    name: str = Field(min_length=1)
    state: WorkerState = WorkerState.READY
    cluster: str = "default"
    labels: dict[str, str] = {}
    ram_total: Bytes
    unified_memory: bool = False
    reserved: Reserved = Reserved()
    backends: list[str] | None = None  # restricts the built-in backend table when given
    gpus: list[GPU] = []

    @field_validator("gpus")
    @classmethod
    def _unique_indexes(cls, gpus: list[GPU]) -> list[GPU]:
        seen = set()
        for g in gpus:
            if g.index in seen:
                raise ValueError(f"GPU index {g.index} appears twice; indexes must be unique per worker")
            seen.add(g.index)
        return gpus

    def gpu(self, index: int) -> GPU | None:
        return next((g for g in self.gpus if g.index == index), None)


class Claim(Strict):
    ram: Bytes = 0
    vram: dict[int, Bytes] = {}  # GPU index -> bytes
    offload_layers: int | None = None
    total_layers: int | None = None
    tensor_split: list[int] | None = None
    is_unified_memory: bool = False
    vram_utilization: float | None = None

    @property
    def vram_total(self) -> int:
        return sum(self.vram.values())


class Subordinate(Strict):
    worker: str
    gpu_indexes: list[int] = []
    claim: Claim = Claim()


class Instance(Strict):
    name: str = Field(min_length=1)
    model: str = Field(min_length=1)
    state: InstanceState = InstanceState.RUNNING
    worker: str | None = None
    gpu_indexes: list[int] = []
    claim: Claim = Claim()
    subordinates: list[Subordinate] = []


class ModelFile(Strict):
    worker: str
    source: str
    state: FileState = FileState.READY

    @field_validator("source", mode="before")
    @classmethod
    def _source_key(cls, v: Any) -> Any:
        if isinstance(v, dict):
            from scheduler.spec import Source

            return Source.model_validate(v).key
        return v


def _repeated(names) -> set[str]:
    seen: set[str] = set()
    dup: set[str] = set()
    for n in names:
        (dup if n in seen else seen).add(n)
    return dup


class ClusterSnapshot(Strict):
    version: int = 1
    workers: list[Worker] = []
    instances: list[Instance] = []
    model_files: list[ModelFile] = []

    @model_validator(mode="after")
    def _consistent(self) -> "ClusterSnapshot":
        if self.version != 1:
            raise ValueError(f"version {self.version} is not supported (this gpuflow reads version 1)")
        dup = _repeated(w.name for w in self.workers)  # a count, not names.count per name: 10,000 rows stay linear
        if dup:
            raise ValueError(f"worker names must be unique; repeated: {', '.join(sorted(dup))}")
        dup = _repeated(i.name for i in self.instances)
        if dup:
            raise ValueError(f"instance names must be unique; repeated: {', '.join(sorted(dup))}")
        return self

    def worker(self, name: str) -> Worker | None:
        return next((w for w in self.workers if w.name == name), None)
