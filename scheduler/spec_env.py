"""Which environment variables a model spec may hand to an engine: an allowlist.

Anyone who can deploy writes the spec, and the engine runs as the agent's user, so ``env`` is
where a deployer could reach code on a GPU host: the dynamic loader (LD_PRELOAD), the shell
(BASH_ENV), the interpreter (PYTHONPATH, PYTHONSTARTUP) and the engines' own libraries all obey
variables. A denylist misses the next one; so only names known to tune an engine pass:
``DEFAULT_ALLOW`` (exact names, or a pattern where every member of the family is a plain knob).
The operators widen it: the control plane's (GPUFLOW_ALLOW_ENV: what a spec may name at all),
and each host's (``gpuflow agent --allow-env PATTERN``: what that host runs; a launch asking for
more is refused there, naming the variable).

Left out on purpose, though they share a prefix with names that are in (whole families such as
``VLLM_*`` or ``NCCL_*`` are not allowed, because each has members like these):
- a library, a plugin or a module to load: VLLM_PLUGINS, VLLM_NCCL_SO_PATH, VLLM_CUDART_SO_PATH,
  NCCL_NET_PLUGIN, NCCL_TUNER_PLUGIN, NCCL_PROFILER_PLUGIN, NCCL_NET, PYTHONWARNINGS (imports
  the categories it names);
- a configuration that can import classes or name plugins: VLLM_LOGGING_CONFIG_PATH,
  VLLM_LOGGING_STREAM ("ext://module.attr"), NCCL_CONF_FILE;
- a file or folder to read or write outside the instance: VLLM_MODEL_REDIRECT_PATH,
  VLLM_CACHE_ROOT, VLLM_CONFIG_ROOT, VLLM_RPC_BASE_PATH, VLLM_TORCH_PROFILER_DIR,
  SGLANG_TORCH_PROFILER_DIR, NCCL_DEBUG_FILE, NCCL_TOPO_FILE, NCCL_TOPO_DUMP_FILE,
  NCCL_GRAPH_FILE, NCCL_GRAPH_DUMP_FILE, TRITON_CACHE_DIR, HF_HOME, HF_HUB_CACHE,
  HF_MODULES_CACHE (transformers imports remote code from there), HF_TOKEN_PATH;
- unpickling or endpoints that run what a client sends: VLLM_ALLOW_INSECURE_SERIALIZATION,
  VLLM_SERVER_DEV_MODE, VLLM_ALLOW_RUNTIME_LORA_UPDATING;
- where the engine talks to: HF_ENDPOINT, VLLM_HOST_IP, VLLM_PORT, llama-server's LLAMA_ARG_*
  (every command-line flag, the ones gpuflow owns included).

``OWNED`` are set by gpuflow for every launch and can never come from a spec, not even through
an operator's pattern.
"""

from __future__ import annotations

import fnmatch
import re

from scheduler.errors import InvalidInput

OWNED = frozenset({
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "RAY_ADDRESS",
    # the replica's engine key (worker_agent/engine_key.py): vLLM's, llama-server's, llama-cpp-python's, a custom's
    "VLLM_API_KEY", "LLAMA_API_KEY", "API_KEY", "GPUFLOW_ENGINE_API_KEY",
    # the launch's base environment (worker_agent/processes.py BASE_ENV)
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "LD_LIBRARY_PATH", "CUDA_HOME",
})
OWNED_PATTERNS = ("LC_*",)

DEFAULT_ALLOW = (
    # threads and runtime switches
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TOKENIZERS_PARALLELISM",
    "CUDA_LAUNCH_BLOCKING", "CUDA_MODULE_LOADING", "CUDA_DEVICE_MAX_CONNECTIONS",
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTHONUNBUFFERED", "PYTHONHASHSEED",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT", "TORCH_NCCL_ENABLE_MONITORING",
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
    # NCCL's transport and tuning knobs (no plugin, no file)
    "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_SOCKET_IFNAME", "NCCL_SOCKET_FAMILY", "NCCL_SOCKET_NTHREADS",
    "NCCL_NSOCKS_PERTHREAD", "NCCL_IB_DISABLE", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_IB_TIMEOUT",
    "NCCL_IB_RETRY_CNT", "NCCL_IB_SL", "NCCL_IB_TC", "NCCL_IB_QPS_PER_CONNECTION", "NCCL_P2P_DISABLE",
    "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE", "NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ", "NCCL_CUMEM_ENABLE",
    "NCCL_NVLS_ENABLE", "NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_BUFFSIZE",
    "NCCL_NTHREADS", "NCCL_CROSS_NIC", "NCCL_LAUNCH_MODE", "NCCL_COLLNET_ENABLE", "NCCL_IGNORE_CPU_AFFINITY",
    "NCCL_ASYNC_ERROR_HANDLING", "NCCL_BLOCKING_WAIT",
    # Hugging Face libraries inside the engine: offline switches, quiet logs, the deployer's token
    "HF_HUB_OFFLINE", "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_DISABLE_PROGRESS_BARS", "HF_HUB_ENABLE_HF_TRANSFER",
    "HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT", "HF_TOKEN", "TRANSFORMERS_OFFLINE", "TRANSFORMERS_VERBOSITY",
    "HF_DATASETS_OFFLINE",
    # vLLM's tuning knobs
    "VLLM_ATTENTION_BACKEND", "VLLM_USE_V1", "VLLM_WORKER_MULTIPROC_METHOD", "VLLM_ENABLE_V1_MULTIPROCESSING",
    "VLLM_ENGINE_ITERATION_TIMEOUT_S", "VLLM_ENGINE_READY_TIMEOUT_S", "VLLM_RPC_TIMEOUT", "VLLM_LOGGING_LEVEL",
    "VLLM_LOGGING_PREFIX", "VLLM_LOG_STATS_INTERVAL", "VLLM_CONFIGURE_LOGGING", "VLLM_NO_USAGE_STATS",
    "VLLM_DO_NOT_TRACK", "VLLM_FLASH_ATTN_VERSION", "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_USE_TRITON_FLASH_ATTN",
    "VLLM_USE_DEEP_GEMM", "VLLM_ALLOW_LONG_MAX_MODEL_LEN", "VLLM_FUSED_MOE_CHUNK_SIZE",
    "VLLM_MARLIN_USE_ATOMIC_ADD", "VLLM_MLA_DISABLE", "VLLM_SKIP_P2P_CHECK", "VLLM_DISABLE_COMPILE_CACHE",
    "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "VLLM_IMAGE_FETCH_TIMEOUT", "VLLM_VIDEO_FETCH_TIMEOUT",
    "VLLM_AUDIO_FETCH_TIMEOUT", "VLLM_MAX_AUDIO_CLIP_FILESIZE_MB", "VLLM_SLEEP_WHEN_IDLE", "VLLM_ROCM_USE_AITER",
    # SGLang's
    "SGLANG_ENABLE_JIT_DEEPGEMM", "SGL_ENABLE_JIT_DEEPGEMM", "SGLANG_DISABLE_CUDNN_CHECK",
    "SGLANG_SET_CPU_AFFINITY", "SGLANG_LOG_LEVEL",
    # llama.cpp's (CUDA backend switches; LLAMA_ARG_* stays out: those are the command line)
    "GGML_CUDA_ENABLE_UNIFIED_MEMORY", "GGML_CUDA_FORCE_MMQ", "GGML_CUDA_FORCE_CUBLAS", "LLAMA_LOG_COLORS",
    "LLAMA_LOG_VERBOSITY", "LLAMA_LOG_TIMESTAMPS", "LLAMA_LOG_PREFIX",
    # simulated GPUs only: the share of its claim a replica uses (worker_agent/sim_processes.py, gpuflow/simulate.py)
    "GPUFLOW_SIMULATED_VRAM_USE",
)

KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_VALUE = 32768  # bytes of one value; an argument or environment string beyond this is no tuning knob


def _matches(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def owned(name: str) -> bool:
    return name in OWNED or _matches(name, OWNED_PATTERNS)


_OPERATOR: tuple[str, ...] = ()  # this process's extra patterns: see allow_more


def allow_more(patterns) -> None:
    """The control plane's operator widens what specs may set, for this process, once at start
    (settings ``allow_env``, GPUFLOW_ALLOW_ENV). Spec validation in this process then accepts
    those names too (each agent still decides for itself with --allow-env). Only widen it: a
    running workflow that validated a name must validate it again when replayed."""
    global _OPERATOR
    bad = [why for p in patterns if (why := allow_pattern_problem(p))]
    if bad:
        raise InvalidInput("GPUFLOW_ALLOW_ENV: " + "; ".join(bad))
    _OPERATOR = tuple(patterns)


def operator_patterns() -> tuple[str, ...]:
    return _OPERATOR


def env_problem(name: object, value: object, extra: tuple[str, ...] = ()) -> str | None:
    """Why the spec may not set ``name`` to ``value`` (None when it may). ``extra``: the patterns
    this host's operator added with ``gpuflow agent --allow-env``."""
    if not isinstance(name, str) or not KEY.fullmatch(name):
        return (f"env name {name!r} is not a variable name (letters, digits and '_', not starting with a digit; "
                "no '=', no NUL)")
    if not isinstance(value, str):
        return f"env {name}: the value must be a string"
    if "\x00" in value:
        return f"env {name}: the value holds a NUL byte"
    if len(value.encode()) > MAX_VALUE:
        return f"env {name}: the value is longer than {MAX_VALUE} bytes"
    if name == SIMULATED_VRAM_USE and (why := _share_problem(value)):
        return f"env {name}: {why}"
    if owned(name):
        return f"env {name} is set by gpuflow for every launch and cannot be overridden"
    if not (name in DEFAULT_ALLOW or _matches(name, extra)):
        return (f"env {name} is not allowed: a spec may set only known engine-tuning variables (their list: "
                "scheduler/spec_env.py DEFAULT_ALLOW; why: docs/operations/security.md), and those its operators "
                "allowed (GPUFLOW_ALLOW_ENV on the control plane, 'gpuflow agent --allow-env PATTERN' on each host)")
    return None


SIMULATED_VRAM_USE = "GPUFLOW_SIMULATED_VRAM_USE"  # simulated GPUs: the share of its claim a replica uses
MAX_SIMULATED_SHARE = 16.0  # a share above this is a typo, not a rehearsal


def _share_problem(value: str) -> str | None:
    """GPUFLOW_SIMULATED_VRAM_USE's value: a number from 0 to MAX_SIMULATED_SHARE (0.5: half the claim)."""
    try:
        share = float(value)
    except ValueError:
        share = -1.0
    if not 0.0 <= share <= MAX_SIMULATED_SHARE:  # also refuses nan and inf
        return f"{value[:40]!r} is not a share of the claim from 0 to {MAX_SIMULATED_SHARE:g} (0.5: half of it)"
    return None


def env_problems(env: dict, extra: tuple[str, ...] = ()) -> list[str]:
    return [why for k, v in env.items() if (why := env_problem(k, v, extra))]


def allow_pattern_problem(pattern: str) -> str | None:
    """An operator's pattern: a name, or a prefix and '*' (a bare '*' would allow LD_PRELOAD)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\*?", pattern or ""):
        return (f"--allow-env {pattern!r}: give a variable name, or a prefix ending in '*' (such as MYAPP_*); "
                "a bare '*' or other wildcards would let a spec set anything")
    return None
