"""The model spec: what to run, with which backend, how many replicas, and placement wishes.
Documented in docs/formats.md."""

from __future__ import annotations

import fnmatch
import re
import shlex
from enum import Enum
from functools import lru_cache

from typing import Annotated

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from scheduler.autoscale.config import Autoscaling
from scheduler.fields import Bytes, Strict
from scheduler.gpu_selector import GPU_ID, GPUId, GPUSelector  # noqa: F401  (where they were)
from scheduler.groups.spec import Disaggregation, Gather, RoleSpec, role_data, role_problems
from scheduler.engine_flags import spec_flag_problems
from scheduler.rollout import RolloutConfig
from scheduler.spec_timings import DeploymentTimings
from scheduler.tenancy.config import NAME as TENANT_PATTERN
from scheduler.bounds import MAX_COMMAND, MAX_ITEMS, MAX_WORDS, Command, Flag, Labels, Path, ShortText, Whole, Word
from scheduler.naming import NAME_MAX, NAME_PATTERN, name_problem
from scheduler.spec_env import env_problems, operator_patterns
from scheduler.limits import REPLICAS_CEILING

MAX_SHARED_WITH = 256  # tenants a deployment's shared_with may name
_TENANT_NAME = re.compile(TENANT_PATTERN)


class Backend(str, Enum):
    VLLM = "vllm"
    SGLANG = "sglang"
    LLAMA_CPP = "llama.cpp"
    CUSTOM = "custom"
    VOXBOX = "voxbox"


class PlacementStrategy(str, Enum):
    SPREAD = "spread"
    BINPACK = "binpack"


class TopologyPolicy(str, Enum):
    """Kubernetes Topology Manager's policies, over the NUMA nodes of a replica's GPUs
    (scheduler/topology_policy.py)."""

    NONE = "none"
    BEST_EFFORT = "best-effort"
    RESTRICTED = "restricted"
    SINGLE_NUMA_NODE = "single-numa-node"


class Routing(str, Enum):
    """How a gateway picks a replica for each request (docs/routing.md). It changes no placement
    decision: the scheduler never reads it."""

    CACHE_AWARE = "cache-aware"  # where the prompt's prefix is cached, within a load guard
    LEAST_OUTSTANDING = "least-outstanding"


class ClaimsMode(str, Enum):
    """What learned memory claims (scheduler/claims/) do for a deployment: ``advise`` shows what
    they would change; ``apply`` books them for new placements (once confident, never below the
    weights)."""

    ADVISE = "advise"
    APPLY = "apply"


class HubFile(Strict):
    repo: str = Field(min_length=1, max_length=256)
    file: str | None = Field(None, max_length=1024)  # may be a glob, e.g. "*Q4_K_M*.gguf"

    @field_validator("repo")
    @classmethod
    def _repo_id(cls, repo: str) -> str:
        """ORG/NAME (or NAME), each a name (scheduler/naming.py): it becomes folders on the host."""
        parts = repo.split("/")
        if len(parts) > 2 or ".." in repo or any(name_problem(x) for x in parts):
            raise ValueError(f"repo {repo!r} is not ORG/NAME (letters, digits, '.', '_', '-')")
        return repo

    @field_validator("file")
    @classmethod
    def _relative(cls, file: str | None) -> str | None:
        """A path inside the repository: no absolute path, no '..', no empty or '.' segment."""
        if file is not None and (file.startswith("/") or "\\" in file or "\x00" in file
                                 or any(seg in ("", ".", "..") for seg in file.split("/"))):
            raise ValueError(f"file {file!r} is not a path inside the repository")
        return file

    @property
    def is_glob(self) -> bool:
        return bool(self.file) and any(ch in self.file for ch in "*?[")

    def pick(self, names: list[str]) -> list[str]:
        """The repository files ``file`` names, sorted (a glob may match every shard of a split
        GGUF); [] when none does."""
        if not self.file:
            return sorted(names)
        if not self.is_glob:
            return [self.file] if self.file in names else []
        return sorted(n for n in names if fnmatch.fnmatchcase(n, self.file))


class Source(Strict):
    local_path: Path | None = None
    huggingface: HubFile | None = None
    modelscope: HubFile | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> "Source":
        given = [k for k in ("local_path", "huggingface", "modelscope") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of local_path, huggingface, modelscope (got {given or 'none'})")
        return self

    @property
    def key(self) -> str:
        """The string that identifies this source in the snapshot's model_files."""
        if self.local_path:
            return self.local_path
        hub, f = ("huggingface", self.huggingface) if self.huggingface else ("modelscope", self.modelscope)
        return f"{hub}:{f.repo}" + (f":{f.file}" if f.file else "")

    @property
    def is_gguf(self) -> bool:
        name = self.local_path or (self.huggingface or self.modelscope).file or ""
        return name.endswith(".gguf")


class Api(str, Enum):
    """The API a deployment's engine serves, for the gateway (it changes no placement): ``openai``
    (the OpenAI HTTP API: /v1/chat/completions, /v1/completions, /v1/embeddings), or ``none`` (an
    engine the gateway cannot relay: it is left out of /v1/models and the console's playground,
    and a request naming it is refused, naming why)."""

    OPENAI = "openai"
    NONE = "none"


# A spec without ``api`` serves its backend's: vLLM, SGLang and llama.cpp's servers serve the OpenAI
# API, and so does voxbox (its audio routes). A custom command is taken to as well: every custom
# engine gpuflow starts (its stand-in, the tests') and the engines users run (TGI, LMDeploy, Ollama,
# LiteLLM) serve it, and the gateway has always relayed them, so specs written before ``api``
# stay listed; one that serves something else says ``api: none``.
BACKEND_API = {"vllm": Api.OPENAI, "sglang": Api.OPENAI, "llama.cpp": Api.OPENAI, "voxbox": Api.OPENAI,
               "custom": Api.OPENAI}


class Resources(Strict):
    vram: Bytes | None = None  # per replica, split over its GPUs
    ram: Bytes | None = None


@lru_cache(maxsize=256)
def command_words(cmd: str) -> tuple[str, ...]:
    """``cmd`` split as a POSIX shell would, nothing expanded (shlex; ValueError when it cannot
    be). Kept per command: every replica's workflow validates its spec, and the command filter
    reads each decision's first word, so a burst split the same few commands thousands of times
    (issue 37: 6% of the control-plane worker's Python time). Commands are bounded (MAX_COMMAND)."""
    return tuple(shlex.split(cmd))


def _check_run_command(cmd: str) -> None:
    """The agent splits run_command as a POSIX shell would (nothing expanded): a command it
    cannot split is refused here, naming why, rather than on the host at launch."""
    try:
        words = command_words(cmd)
    except ValueError as e:
        raise ValueError(f"run_command {cmd!r} cannot be split into words: {e} (check its quotes)") from None
    if not words:
        raise ValueError("run_command is empty")


class ModelSpec(Strict):
    name: str = Field(min_length=1, max_length=128, pattern=NAME_PATTERN)  # its instances are NAME-<n>
    source: Source
    backend: Backend
    backend_version: ShortText | None = None
    backend_parameters: list[Word] = Field([], max_length=MAX_WORDS)
    run_command: Command | None = None  # bounded before it is split: a 1 MiB one took 87 s to split
    env: dict[Annotated[str, Field(max_length=256)], Annotated[str, Field(max_length=MAX_COMMAND)]] = \
        Field({}, max_length=MAX_ITEMS)
    replicas: Whole = Field(default=1, ge=0, le=REPLICAS_CEILING)
    placement_strategy: PlacementStrategy = PlacementStrategy.SPREAD
    worker_selector: Labels = {}
    gpu_selector: GPUSelector = GPUSelector()
    cpu_offloading: Flag | None = None  # None: on for llama.cpp, off otherwise (offloads_to_cpu)
    distributed_inference_across_workers: Flag | None = None
    categories: list[ShortText] = Field([], max_length=64)
    draft_model: Source | None = None
    resources: Resources | None = None
    cluster: ShortText = "default"
    autoscaling: Autoscaling | None = None  # metric-driven replicas (docs/formats.md); replicas is then the start
    topology_policy: TopologyPolicy = TopologyPolicy.NONE
    cpu_pinning: Flag = False  # bind the engine to its GPUs' NUMA node (CPUs, and memory where numactl is)
    max_concurrency: Whole | None = Field(default=None, ge=1, le=1_000_000)  # gateway: requests per replica at once, unless an engine flag says
    rollout: RolloutConfig = RolloutConfig()  # how a changed spec replaces the replicas (docs/formats.md)
    timings: DeploymentTimings | None = None  # the per-deployment timings (scheduler/spec_timings.py); the rest are the cluster's
    tenant: str | None = Field(default=None, max_length=NAME_MAX, pattern=TENANT_PATTERN)  # None: "default" (the tenants file)
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000)  # orders its tenant's deployments
    shared_with: list[Annotated[str, Field(max_length=63)]] = Field(default=[], max_length=MAX_SHARED_WITH)  # gateway: other tenants' keys may use it ("*": all)
    routing: Routing | None = None  # gateway: how requests pick a replica; None: the gateway's --routing
    api: Api | None = None  # gateway: the API its engine serves (openai, none); None: its backend's (BACKEND_API)
    roles: list[RoleSpec] | None = Field(None, min_length=1, max_length=3)  # a prefill/decode group (scheduler/groups/)
    disaggregation: Disaggregation | None = None  # how the group's roles hand KV across
    gather: Gather | None = None  # how tightly the group's members sit (a topology layer)
    claims: ClaimsMode | None = None  # learned memory claims: advise or apply; None: the cluster's GPUFLOW_CLAIMS__MODE

    @property
    def is_group(self) -> bool:
        """A multi-role group: placed, admitted and scaled as one (scheduler/groups/)."""
        return bool(self.roles)

    @property
    def tenant_name(self) -> str:
        return self.tenant or "default"

    @property
    def serves(self) -> Api:
        """The API its engine serves: ``api``, else its backend's."""
        return self.api or BACKEND_API[self.backend.value]

    @field_validator("shared_with")
    @classmethod
    def _tenants(cls, names: list[str]) -> list[str]:
        """Each a tenant's name (as ``tenant``) or "*" (every tenant), none twice."""
        for n in names:
            if n != "*" and not _TENANT_NAME.fullmatch(n):
                raise ValueError(f"shared_with: {n[:80]!r} is not a tenant's name ({TENANT_PATTERN}) or '*'")
        if len(set(names)) != len(names):
            raise ValueError("shared_with: a tenant appears twice")
        return names

    @field_validator("env")
    @classmethod
    def _allowed_env(cls, env: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        """scheduler/spec_env.py: only known engine-tuning variables, and those the control
        plane's operator added (or, given as context {"allow_env": (...)}, the caller's)."""
        ctx = info.context or {}
        extra = tuple(ctx["allow_env"]) if "allow_env" in ctx else operator_patterns()
        problems = env_problems(env, extra)
        if problems:
            raise ValueError("; ".join(problems))
        return env

    @model_validator(mode="after")
    def _coherent(self) -> "ModelSpec":
        problems = spec_flag_problems(self.backend.value, self.backend_parameters)
        if problems:
            raise ValueError("; ".join(problems))
        if self.backend == Backend.CUSTOM and not self.run_command:
            raise ValueError("backend custom needs run_command")
        if self.run_command and self.backend != Backend.CUSTOM:
            raise ValueError(f"run_command is only for backend custom (backend is {self.backend.value})")
        if self.run_command:
            _check_run_command(self.run_command)
        if self.backend == Backend.LLAMA_CPP and not self.source.is_gguf and not self.resources:
            raise ValueError("backend llama.cpp needs a .gguf source (local_path or hub file)")
        if self.backend == Backend.LLAMA_CPP and self.resources:
            raise ValueError("resources cannot override llama.cpp estimates; set --ctx-size and friends in backend_parameters")
        if self.roles is None and (self.disaggregation or self.gather):
            raise ValueError("disaggregation and gather need roles: declare a prefill and a decode role")
        problems = role_problems(self.roles, self.replicas, self.backend.value, self.backend_parameters,
                                 self.disaggregation) if self.roles else []
        if problems:
            raise ValueError("; ".join(problems))
        for r in self.roles or []:  # each role's effective spec passes every check a deployment's does
            try:
                ModelSpec.model_validate(role_data(self.model_dump(exclude_none=True), r))
            except ValidationError as e:
                raise ValueError("; ".join(f"roles.{r.name.value}: {x['msg'].removeprefix('Value error, ')}"
                                           for x in e.errors())) from None
        return self

    @property
    def offloads_to_cpu(self) -> bool:
        """GPUStack's default for GGUF models served by llama.cpp (its llama-box backend): on, so a
        host without a GPU, or with too little VRAM, runs the model (partly) on the CPU; off for
        every other backend."""
        if self.cpu_offloading is not None:
            return self.cpu_offloading
        return self.backend == Backend.LLAMA_CPP

    @property
    def distributed(self) -> bool:
        """GPUStack's default: on for vLLM and SGLang, off otherwise."""
        if self.distributed_inference_across_workers is not None:
            return self.distributed_inference_across_workers
        return self.backend in (Backend.VLLM, Backend.SGLANG)
