"""What crosses Temporal between the control plane and a host agent (the host task queue)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from contracts.booking_proof import BookingProof

from scheduler.bounds import CpuText, MAX_COMMAND, MAX_ITEMS, MAX_TEXT, MAX_WORDS, Command, Indexes, Name, Path, Seconds, ShortText, Word
from scheduler.limits import MAX_BYTES, MAX_GPUS
from scheduler.naming import NAME_MAX

WATCH_HOST = "watch_host"
LAUNCH_INSTANCE = "launch_instance"
SUPERVISE_INSTANCE = "supervise_instance"
STOP_INSTANCE = "stop_instance"
PREPARE_MODEL = "prepare_model"
READ_MODEL_HEADER = "read_model_header"


ROLES = ("server", "rpc-server", "ray-head", "ray-worker", "sglang-node")
PD_ROLES = ("prefill", "decode")  # a prefill/decode group's members that hand KV across (a router hands none)
# a group's disaggregation.mode (scheduler/groups/spec.py PDMode's values; a test keeps them equal)
PD_MODES = ("vllm-nixl", "vllm-mooncake", "sglang-mooncake", "sglang-nixl", "vllm-ascend-mooncake", "custom")
PDRole = Literal["prefill", "decode"]
PDModeName = Literal["vllm-nixl", "vllm-mooncake", "sglang-mooncake", "sglang-nixl", "vllm-ascend-mooncake", "custom"]
KEY_ID_PATTERN = r"^[A-Za-z0-9_-]{16,64}$"  # an engine key's nonce (worker_agent/engine_key.py)


def instance_of(key: str) -> str:
    """The instance a process key belongs to: ``m-0`` for ``m-0`` and for its helper ``m-0@rpc0``."""
    return key.split("@", 1)[0]


class LaunchRequest(BaseModel):
    """One process of an instance. ``role`` server is the inference server itself; the other roles
    are the helpers a placement across several workers needs (llama.cpp's rpc-server on each
    subordinate GPU; a Ray head beside vLLM and a Ray worker on each subordinate host). A helper's
    process is kept under ``key`` = instance@part."""

    instance: Name
    model: Annotated[str, Field(max_length=NAME_MAX)]
    backend: ShortText
    run_command: Command | None = None
    model_path: Path | None = None
    gpu_indexes: Indexes = []
    gpu_vendor: ShortText = "nvidia"
    env: dict[Annotated[str, Field(max_length=MAX_TEXT)], Annotated[str, Field(max_length=MAX_COMMAND)]] = \
        Field({}, max_length=MAX_ITEMS)
    ready_timeout_s: Seconds = 600.0
    settle_s: Seconds = 3.0
    backend_parameters: list[Word] = Field([], max_length=MAX_WORDS)
    offload_layers: int | None = Field(None, ge=0, le=100_000)  # llama.cpp: layers on the GPUs (-ngl)
    tensor_split: list[Annotated[int, Field(ge=0, le=MAX_BYTES)]] | None = Field(None, max_length=MAX_GPUS)  # llama.cpp: bytes per GPU, in gpu_indexes order
    vram_utilization: float | None = Field(None, ge=0, le=1)  # vLLM/SGLang: fraction of each card the claim booked
    distributed: bool = False  # the placement spans other workers too
    role: Literal["server", "rpc-server", "ray-head", "ray-worker", "sglang-node"] = "server"  # ROLES
    part: Annotated[str, Field(max_length=40)] = ""  # a helper's name within the instance (sub0, ray-head, ...)
    rpc_servers: list[ShortText] = Field([], max_length=MAX_GPUS)  # llama.cpp over RPC: host:port of each rpc-server, tensor-split order
    ray_address: ShortText | None = None  # vLLM over several workers: the Ray head's host:port
    pipeline_parallel: int | None = Field(None, ge=1, le=MAX_GPUS)  # vLLM over several workers: one stage per worker
    nnodes: int | None = Field(None, ge=1, le=MAX_GPUS)  # SGLang over several workers: how many nodes, this one's rank,
    node_rank: int | None = Field(None, ge=0, le=MAX_GPUS)  # rank 0's torch.distributed address (host:port; rank 0's agent
    dist_init_addr: ShortText | None = None  # picks the port) and the tensor parallelism across all of them
    tp_total: int | None = Field(None, ge=1, le=MAX_GPUS)
    wait_ready: bool = True  # False: return once started (SGLang's rank 0 is ready only when every node joined)
    liveness_s: Seconds = 10.0  # probe a RUNNING server this often (0: never)
    liveness_failures: int = Field(3, ge=1, le=1000)  # this many misses in a row: the server is stopped and restarted
    cpu_pinning: bool = False  # bind the process to ``cpus`` (and, with numactl, ``numa_nodes``' memory)
    cpus: CpuText | None = None  # CPU list local to the GPUs ("0-31,64-95"), from the placement; None: unknown
    numa_nodes: Indexes | None = None  # the GPUs' NUMA nodes, from the placement; None: unknown
    # Read by no agent and set by no workflow since the agent supervises its processes itself
    # (worker_agent/supervision.py): a supervisor activity's cancel stopped the process too when
    # True. Kept: recorded histories carry it.
    stop_on_cancel: bool = False
    # What the ledger booked for this instance on this host (a server's request; helpers carry none),
    # and what the figures belong to: the agent reports each replica's measured memory against it
    # (contracts/usage.py). Empty from a workflow that predates them: the use is still measured.
    vram_claim: dict[Annotated[int, Field(ge=0, le=MAX_GPUS)], Annotated[int, Field(ge=0, le=MAX_BYTES)]] = \
        Field({}, max_length=MAX_GPUS)
    ram_claim: int = Field(0, ge=0, le=MAX_BYTES)
    vram_stated: int = Field(0, ge=0, le=MAX_BYTES)  # the spec's resources.vram (0: none): a simulated host's base of use
    source: Annotated[str, Field(max_length=MAX_TEXT)] = ""  # the model's source key (hf:..., local:...)
    # The control plane's signed booking for this launch (contracts/booking_proof.py): taken once,
    # fresh, in place of asking the host workflow; None, or one that does not hold: the ledger is asked.
    booking_proof: BookingProof | None = None
    # A prefill/decode group's member: its role and the group's mode; the agent adds that mode's
    # flags and picks its KV ports (worker_agent/pd_argv.py). None: a plain replica, or a router.
    pd_role: PDRole | None = None
    pd_mode: PDModeName | None = None

    @property
    def key(self) -> str:
        return f"{self.instance}@{self.part}" if self.part else self.instance


class ModelFetch(BaseModel):
    """Fetch a hub source's files into the host's model cache (``source`` as in the model spec)."""

    instance: Name
    source: dict


class ModelReady(BaseModel):
    path: str  # the file, or the repository's snapshot folder
    bytes: int = 0  # on disk for this repository


class DownloadProgress(BaseModel):
    """What prepare_model heartbeats: ``gpuflow status`` reads it off the pending activity."""

    what: str
    done: int
    total: int | None = None


class LaunchResult(BaseModel):
    pid: int
    port: int | None = None
    adopted: bool = False
    address: str = ""  # the agent's advertised address: where other hosts reach a helper's port
    dist_port: int | None = None  # SGLang's rank 0: the port of its --dist-init-addr
    kv_events_port: int | None = None  # its engine publishes KV-cache events there (ZMQ PUB), on ``address``
    # its engine's KV hand-off port on ``address`` (worker_agent/pd_argv.py): SGLang's bootstrap port,
    # vLLM's NIXL side channel (rank 0's), a custom command's {bootstrap_port} (else its {kv_port})
    bootstrap_port: int | None = Field(None, ge=1, le=65535)
    argv: list[str] = []
    log: str = ""
    binding: str = ""  # CPU pinning: what the process is bound to, or why it is not (pinning asked)
    # the nonce its engine key was made from (worker_agent/engine_key.py; None: it has no key). The
    # control plane makes the same key from it; the key itself never crosses Temporal
    key_id: str | None = Field(None, pattern=KEY_ID_PATTERN, max_length=64)
    # the host's MAC over what the store and the gateways use of it (contracts/launch_proof.py): the
    # store writes the replica RUNNING at this address only when it verifies ("": no credential)
    mac: str = Field("", pattern=r"^([0-9a-f]{64})?$", max_length=64)


class ExitReport(BaseModel):
    pid: int | None = None
    returncode: int | None = None
    reason: str


class LogRequest(BaseModel):
    instance: Annotated[str, Field(max_length=NAME_MAX + 41)]  # instance or instance@part: checked by the reader
    worker: Name
    offset: int = Field(-4096, ge=-MAX_BYTES, le=MAX_BYTES)  # negative: that many bytes from the end
    max_bytes: int = Field(65536, ge=0, le=2**24)


class LogChunk(BaseModel):
    text: str
    offset: int  # where the next read starts
    found: bool = True
    more: bool = False  # the file already holds more after ``offset`` (the read stopped at max_bytes)
