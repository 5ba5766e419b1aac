"""The cluster snapshot: workers with their GPUs, placed instances with their claims, and which
model files each worker holds. Documented in docs/formats.md (format version 1).

Byte fields take integers or strings with a unit ("24 GiB", "512MiB", "16GB").
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, field_validator, model_validator

from scheduler import cpulist
from scheduler.bounds import Labels
from scheduler.command_set import MAX_CHARS as MAX_COMMAND_SET
from scheduler.fields import Bytes, Strict
from scheduler.groups.layers import TopologyLayer, chain_problems
from scheduler.groups.spec import RoleName
from scheduler.spec import Source
from scheduler.limits import MAX_BYTES, MAX_GPUS
from scheduler.naming import NAME_MAX


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
    MISSING = "missing"  # its agent looked for a local path and did not find it


class Reserved(Strict):
    ram: Bytes = 0
    vram: Bytes = 0  # reserved on each GPU


class Link(str, Enum):
    """The PCIe/system path between two GPUs, as NVML's nvmlDeviceGetTopologyCommonAncestor names it
    (nvidia-smi topo -m: PIX = single, PXB = multiple, PHB = hostbridge, NODE = node, SYS = system)."""

    INTERNAL = "internal"  # one board
    SINGLE = "single"  # one PCIe switch
    MULTIPLE = "multiple"  # several switches, no host bridge
    HOSTBRIDGE = "hostbridge"
    NODE = "node"  # one NUMA node, across host bridges
    SYSTEM = "system"  # across CPU sockets


CpuList = Annotated[str, BeforeValidator(cpulist.normalise), Field(max_length=4096)]


class GPU(Strict):
    index: int = Field(ge=0, le=MAX_GPUS)
    vendor: str = Field("nvidia", max_length=64)
    type: str = Field("cuda", max_length=64)
    name: str = Field("", max_length=256)
    uuid: str | None = Field(None, max_length=128)  # NVML's GPU-... id, stable across reboots and reorderings
    vram_total: Bytes
    vram_used: Bytes | None = None  # observed use, ours and others'
    vram_foreign: Bytes | None = None  # held by processes gpuflow did not start (NVML's per-process list)
    # topology, each optional (absent: unknown); see scheduler/interconnect.py
    numa_node: int | None = Field(None, ge=0, le=4096)
    pci_bus_id: str | None = Field(None, max_length=64)
    nvlink_peers: list[Annotated[int, Field(ge=0, le=MAX_GPUS)]] | None = Field(None, max_length=MAX_GPUS)  # GPU indexes on the same worker joined to this one by NVLink
    pcie_switch: str | None = Field(None, max_length=64)  # GPUs with the same id sit under one PCIe switch
    links: dict[Annotated[int, Field(ge=0, le=MAX_GPUS)], Link] | None = Field(None, max_length=MAX_GPUS)  # GPU index -> the path to it (NVML's common ancestor)
    cpus: CpuList | None = None  # CPUs local to the GPU, as a Linux CPU list ("0-31,64-95")


def check_gpus(gpus: list[GPU]) -> list[GPU]:
    """One host's GPUs make sense together: each index once, and topology names only other GPUs
    of the same host. Checked wherever a host's GPUs are read (the snapshot file, the agent's
    inventory file and report, the control plane's intake), so one host's bad list never reaches
    the policy for the whole cluster."""
    seen = set()
    for g in gpus:
        if g.index in seen:
            raise ValueError(f"GPU index {g.index} appears twice; indexes must be unique per worker")
        seen.add(g.index)
    for g in gpus:
        named = set(g.nvlink_peers or []) | set(g.links or {})
        if named - seen or g.index in named:
            bad = sorted((named - seen) | ({g.index} & named))
            raise ValueError(f"GPU {g.index}: nvlink_peers/links name GPU {bad[0]}, which is not another GPU of this worker")
    return gpus


GPUList = Annotated[list[GPU], Field(max_length=MAX_GPUS), AfterValidator(check_gpus)]


class Worker(Strict):
    name: str = Field(min_length=1)
    state: WorkerState = WorkerState.READY
    cluster: str = "default"
    labels: Labels = {}
    ram_total: Bytes
    unified_memory: bool = False
    reserved: Reserved = Reserved()
    backends: list[str] | None = None  # restricts the built-in backend table when given
    gpus: GPUList = []
    cordoned: bool = False  # an operator cordoned it: no new placements there (filters/cordon.py)
    # the executables on its agent's PATH (command_set.py), for custom commands (filters/command.py); None: unknown
    commands: str | None = Field(None, max_length=MAX_COMMAND_SET)
    # the KV connectors its engines can run ("nixl", "mooncake"), as its agent reports; None: not reported
    kv_connectors: list[Annotated[str, Field(min_length=1, max_length=32)]] | None = Field(None, max_length=16)

    def gpu(self, index: int) -> GPU | None:
        return next((g for g in self.gpus if g.index == index), None)


class Claim(Strict):
    ram: Bytes = 0
    vram: dict[Annotated[int, Field(ge=0, le=MAX_GPUS)], Bytes] = Field({}, max_length=MAX_GPUS)  # GPU index -> bytes
    offload_layers: int | None = Field(None, ge=0, le=100_000)
    total_layers: int | None = Field(None, ge=0, le=100_000)
    tensor_split: list[Annotated[int, Field(ge=0, le=MAX_BYTES)]] | None = Field(None, max_length=MAX_GPUS)
    is_unified_memory: bool = False
    vram_utilization: float | None = Field(None, ge=0, le=1)

    @property
    def vram_total(self) -> int:
        return sum(self.vram.values())


class Subordinate(Strict):
    worker: str = Field(min_length=1, max_length=NAME_MAX)
    gpu_indexes: list[Annotated[int, Field(ge=0, le=MAX_GPUS)]] = Field([], max_length=MAX_GPUS)
    claim: Claim = Claim()


class Instance(Strict):
    name: str = Field(min_length=1)
    model: str = Field(min_length=1)
    state: InstanceState = InstanceState.RUNNING
    worker: str | None = None
    gpu_indexes: list[int] = []
    claim: Claim = Claim()
    subordinates: list[Subordinate] = []
    role: RoleName | None = None  # a member of a prefill/decode group: its role
    group: str | None = Field(None, max_length=NAME_MAX)  # and the deployment whose group it belongs to


class ModelFile(Strict):
    worker: str
    source: str
    state: FileState = FileState.READY

    @field_validator("source", mode="before")
    @classmethod
    def _source_key(cls, v: Any) -> Any:
        if isinstance(v, dict):
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
    topology: list[TopologyLayer] = Field([], max_length=32)  # the cluster's own layers (zone and rack are built in)

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
        problems = chain_problems(self.topology)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def worker(self, name: str) -> Worker | None:
        return next((w for w in self.workers if w.name == name), None)
