"""Inference engines' command lines, built from the placement: argv lists exec'd directly, never
a shell string. The user's backend_parameters are appended as separate words, so they can only
be options of the engine, never another program; a placement input the user gave (the scheduler
booked from it) is kept instead of ours.

| backend | argv | from the placement |
| --- | --- | --- |
| vllm | vllm serve PATH --served-model-name M --host ADDR --port P --enable-prompt-tokens-details | --tensor-parallel-size (GPUs), --gpu-memory-utilization |
| sglang | PYTHON -m sglang.launch_server --model-path PATH ... --port P --enable-cache-report | --tp (GPUs), --mem-fraction-static |
| llama.cpp | llama-server -m PATH --host ADDR --port P | -ngl (offloaded layers), --tensor-split (bytes per GPU) |
| llama.cpp (--llama-cpp-python PY) | PY -m llama_cpp.server --model PATH ... (flags translated) | --n_gpu_layers, --tensor_split |
| custom | run_command, placeholders substituted | {port} {host} {model_path} {gpu_indexes} {kv_events_port} {api_key} {pd_role} {kv_port} {bootstrap_port} |

A prefill/decode group's member gets its mode's flags, env and KV ports too (pd_argv.py).

Each server gets its replica's engine key (engine_key.py): by environment (``engine_key.key_env``),
SGLang by ``--config`` naming a 0600 file, a custom command also by ``{api_key}``.

KV-cache events (``kv_events_config``): on an agent started with ``--kv-events``, vLLM and SGLang
servers get ``--kv-events-config`` with a ZMQ PUB endpoint on a port the agent picks, recorded with
the replica so that gateways follow it (gateway/kv_subscriber.py). Opt-in, because both engines
bind it on every interface (vLLM binds only a wildcard endpoint) and it carries the token ids of
every prompt. A spec's own ``--kv-events-config`` is refused or allowed exactly as any flag
(scheduler/engine_flags/); where it is given, gpuflow adds none and records no port. A custom
run_command that names ``{kv_events_port}`` gets a port on any agent (its command decides where
it binds).

Across several workers (see topology.py): llama.cpp gets ``--rpc`` with each subordinate's
``rpc-server -H ADDR -p P``; vLLM gets ``--distributed-executor-backend ray`` with
``--pipeline-parallel-size`` (one stage per worker) after ``ray start --head`` here and
``ray start --address HEAD`` on each subordinate; SGLang runs one node per worker, rank 0 here
(serving HTTP) and the others with ``--dist-init-addr`` at rank 0, ``--nnodes``, ``--node-rank``.
Helpers and servers bind the agent's advertised address (ADDR; 127.0.0.1 on ``gpuflow dev``), so
gateways on other hosts reach the servers, which answer only requests showing the engine key.

Before any of it, ``check_launch`` refuses what the spec may not ask of this host
(scheduler/engine_flags/, scheduler/spec_env.py): names that are not names, env and flags off
the allowlists (plus this agent's --allow-env and --allow-engine-flag), flags gpuflow owns or
that fetch from the network, files outside the model's folder and --model-root, and flags that
run code unless the agent has --allow-remote-code. Files go to the engine as absolute paths
(relative ones resolved against the model's folder, never the engine's working folder).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from scheduler import params
from scheduler.engine_flags import check_flags, llama_cpp_python
from scheduler.errors import InvalidInput
from scheduler.naming import check_key, check_name
from scheduler.spec_env import env_problems
from worker_agent import pd_argv
from worker_agent.processes import PDWords, build_argv
if TYPE_CHECKING:  # annotations only: the CLI builds `gpuflow agent`'s flags from EngineConfig without it (issue 37)
    from contracts.agent import LaunchRequest


def _flag(flag: str, help: str, **more) -> dict:
    """A field ``gpuflow agent`` sets with ``flag`` (gpuflow/cli/flags.py makes the flag from it)."""
    return {"flag": flag, "help": help, **more}


@dataclass(frozen=True)
class EngineConfig:
    """Which engines this agent runs and where they are. ``allow_custom``: custom run commands
    run only where the operator enabled them. The fields with a flag are ``gpuflow agent``'s
    (the flag, its help and its default come from here)."""

    allow_custom: bool = field(default=False, metadata=_flag(
        "--allow-custom", "run custom backends' run_command (off by default: it runs any program)"))
    vllm: str = field(default="vllm", metadata=_flag("--vllm", "the vllm executable, on PATH or a path"))
    sglang_python: str = field(default="python3", metadata=_flag("--sglang-python", "the Python that has sglang installed"))
    llama_server: str = field(default="llama-server", metadata=_flag("--llama-server", "the llama-server executable"))
    # a Python with llama-cpp-python[server]: used instead of llama-server
    llama_cpp_python: str | None = field(default=None, metadata=_flag(
        "--llama-cpp-python", "serve llama.cpp models with this Python's llama-cpp-python[server] instead of "
        "llama-server"))
    rpc_server: str = field(default="rpc-server", metadata=_flag(
        "--rpc-server", "llama.cpp's rpc-server, run when a placement lends this host's GPUs over RPC"))
    ray: str = field(default="ray", metadata=_flag("--ray", "the ray executable, for vLLM across several hosts"))
    model_roots: tuple[str, ...] = field(default=(), metadata=_flag(  # when given, model paths must lie under one
        "--model-root", "a directory model files may come from (repeatable); paths outside every root are refused"))
    allow_env: tuple[str, ...] = field(default=(), metadata=_flag(  # the operator's extra env patterns
        "--allow-env", "also let specs set these env variables (a name, or a prefix ending in '*'; repeatable); "
        "gpuflow's own variables stay off limits", metavar="PATTERN"))
    allow_remote_code: bool = field(default=False, metadata=_flag(  # --trust-remote-code and friends
        "--allow-remote-code", "let specs pass --trust-remote-code and other flags that run code from the model's "
        "files or import it by name (--worker-extension-cls, --middleware, ...; off by default)"))
    allow_engine_flags: tuple[str, ...] = field(default=(), metadata=_flag(  # flags beyond the engines' lists
        "--allow-engine-flag", "also let specs pass this engine flag, spelled exactly, with any value (repeatable; "
        "beyond each engine's list in docs/formats.md); flags gpuflow sets and flags that fetch from the network "
        "stay refused", metavar="FLAG"))
    host: str = "127.0.0.1"  # where servers listen: the agent's advertised address (argv_for sets it)
    kv_events: bool = field(default=False, metadata=_flag(  # vLLM and SGLang publish KV-cache events for the gateways
        "--kv-events", "start vLLM and SGLang publishing their KV-cache events on a port picked here, for the "
        "gateways' cache-aware routing (off by default: the engines bind it on every interface and it carries every "
        "prompt's token ids; docs/routing.md)"))
    kv_events_port: int | None = None  # this launch's events port (argv_for sets it)
    api_key: str | None = field(default=None, repr=False)  # this launch's engine key (argv_for sets it)
    key_file: str | None = None  # SGLang: the 0600 --config file holding it (argv_for sets it)
    kv_port: int | None = None  # this launch's KV hand-off base port (pd_argv.py; argv_for sets it)
    bootstrap_port: int | None = None  # and its bootstrap port (argv_for sets it)


def check_model_path(path: str | None, roots: tuple[str, ...]) -> None:
    """A local model path must resolve (symlinks and '..' followed) under a configured root."""
    if not path or not roots:
        return
    real = os.path.realpath(path)
    for r in roots:
        root = os.path.realpath(r)
        if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
            return
    raise InvalidInput(f"model path {path} is outside this host's model roots ({', '.join(roots)}); refused")


class EngineUnavailable(InvalidInput):
    """The engine is not installed (or not enabled) on this host."""


class LaunchRefused(InvalidInput):
    """The launch asks what this host does not allow; retrying cannot help."""


def model_folder(req: LaunchRequest) -> str | None:
    """The folder of the model's files: its path, or the folder of its file (a GGUF)."""
    p = req.model_path
    return None if not p else p if os.path.isdir(p) else os.path.dirname(p)


def file_resolver(req: LaunchRequest, cfg: EngineConfig):
    """How this host reads a backend parameter naming a file (scheduler/engine_flags/kinds.py):
    relative to the model's folder, symlinks followed, inside it or a --model-root; the engine
    gets the absolute path. ``must_exist`` False (a chat template may be text, or a built-in's
    name): a word naming no file passes as written, unless the engine's working folder (the
    agent's) has a file by that name."""
    folder = model_folder(req)
    roots = tuple(([folder] if folder else []) + list(cfg.model_roots))
    where = "the model's folder" + (f" or this host's model roots ({', '.join(cfg.model_roots)})" if cfg.model_roots
                                    else "")

    def resolve(value: str, must_exist: bool) -> str:
        cand = value if os.path.isabs(value) else os.path.join(folder, value) if folder else None
        if cand is not None and os.path.exists(cand):
            real = os.path.realpath(cand)
            try:
                check_model_path(real, roots or ("/nonexistent-root",))
            except InvalidInput:
                raise ValueError(f"resolves to {real}, outside {where}; an engine may read only the model's files") \
                    from None
            return real
        if must_exist:
            raise ValueError(f"is not a file in {where}" + (f" ({folder})" if folder and not os.path.isabs(value) else ""))
        if os.path.lexists(value):
            raise ValueError(f"names a file in the agent's working folder; name one in {where}")
        return value

    return resolve


def host_file_problems(req: LaunchRequest, cfg: EngineConfig) -> list[str]:
    """A word naming an existing file or folder outside the model's folder and the --model-roots
    (the engine could read and serve it back): a net under the typed check, for the words of
    flags an operator added. Words naming nothing pass."""
    roots = [p for p in (model_folder(req),) if p] + list(cfg.model_roots)
    out = []
    for word in req.backend_parameters:
        for value in {word, word.split("=", 1)[-1]}:
            if "/" not in value or not os.path.exists(os.path.expanduser(value)):
                continue
            try:
                check_model_path(os.path.expanduser(value), tuple(roots) or ("/nonexistent-root",))
            except InvalidInput:
                out.append(f"backend_parameters: {word!r} names {value}, outside the model's folder"
                           + (f" and this host's model roots ({', '.join(cfg.model_roots)})" if cfg.model_roots else "")
                           + "; an engine may read only the model's files")
                break
    return out


def check_launch(req: LaunchRequest, cfg: EngineConfig) -> list[str]:
    """Everything in ``req`` that came from a spec, checked again here: the names, the env, the
    engine flags (this engine's list and this agent's --allow-engine-flag, files, code).
    LaunchRefused names each problem; otherwise the backend_parameters to pass, files resolved."""
    try:
        check_key(req.key)
        check_name("model", req.model)
    except InvalidInput as e:
        raise LaunchRefused(str(e)) from None
    problems = env_problems(req.env, cfg.allow_env) + pd_argv.problems(req)
    params = list(req.backend_parameters)
    if req.backend != "custom":
        checked = check_flags(req.backend, params, cfg.allow_engine_flags, file_resolver(req, cfg))
        problems += checked.problems or host_file_problems(req, cfg)
        if checked.code and not cfg.allow_remote_code:
            problems.append(f"backend_parameters {', '.join(checked.code)} make the engine run code from the model's "
                            "files or from requests; this host allows that only when its agent runs with "
                            "--allow-remote-code")
        params = checked.params
    if problems:
        raise LaunchRefused("; ".join(problems))
    return params


def _ours(user: list[str], flags: tuple[str, ...], value: str | None) -> list[str]:
    if value is None or params.has(user, *flags):
        return []
    return [flags[0], value]


def _switch(user: list[str], flag: str) -> list[str]:
    """A boolean flag of ours, unless the user's parameters already name it (any form)."""
    return [] if params.has(user, flag) else [flag]


# An answer's usage says how many of its prompt's tokens the engine had cached
# (usage.prompt_tokens_details.cached_tokens): the gateway's prefix index corrects itself from it
# (gateway/index_feedback.py, docs/routing.md). Off by default in both engines; it costs a field per answer.
CACHE_REPORT = {"vllm": "--enable-prompt-tokens-details", "sglang": "--enable-cache-report"}


def _need_model(req: LaunchRequest) -> str:
    if not req.model_path:
        raise InvalidInput(f"backend {req.backend} needs the model's local path (model downloads come later)")
    return req.model_path


def vllm_argv(req: LaunchRequest, port: int, cfg: EngineConfig) -> list[str]:
    u = req.backend_parameters
    n = len(req.gpu_indexes)
    pp = req.pipeline_parallel if req.ray_address else None
    user_pp = params.has(u, "--pipeline-parallel-size", "-pp", "--pp")
    return ([cfg.vllm, "serve", _need_model(req), "--served-model-name", req.model, "--host", cfg.host,
             "--port", str(port)]
            + _ours(u, ("--tensor-parallel-size", "-tp", "--tp"), str(n) if (n > 1 or pp) and (pp or not user_pp)
                    else None)
            + _ours(u, ("--pipeline-parallel-size", "-pp", "--pp"), str(pp) if pp else None)
            + _ours(u, ("--distributed-executor-backend",), "ray" if pp else None)
            + _ours(u, ("--gpu-memory-utilization",), f"{req.vram_utilization:.4f}" if req.vram_utilization else None)
            + _ours(u, ("--kv-events-config",), kv_events_config("vllm", cfg.kv_events_port))
            + pd_argv.vllm_flags(req, cfg.kv_port)
            + _switch(u, CACHE_REPORT["vllm"])
            + list(u))


def sglang_argv(req: LaunchRequest, port: int | None, cfg: EngineConfig) -> list[str]:
    """One SGLang node: the server (rank 0, with a port), or, across several workers, another
    rank (no port: only rank 0 serves HTTP). TP spans every node's GPUs."""
    u = req.backend_parameters
    tp = req.tp_total or len(req.gpu_indexes)
    nodes = (["--dist-init-addr", req.dist_init_addr, "--nnodes", str(req.nnodes), "--node-rank", str(req.node_rank or 0)]
             if req.nnodes and req.nnodes > 1 and req.dist_init_addr else [])
    return ([cfg.sglang_python, "-m", "sglang.launch_server", "--model-path", _need_model(req),
             "--served-model-name", req.model] + (["--host", cfg.host, "--port", str(port)] if port else [])
            + _ours(u, ("--tp", "--tp-size", "--tensor-parallel-size"), str(tp) if tp > 1 else None)
            + _ours(u, ("--mem-fraction-static",), f"{req.vram_utilization:.4f}" if req.vram_utilization else None)
            + (_ours(u, ("--kv-events-config",), kv_events_config("sglang", cfg.kv_events_port)) if port else [])
            + (["--config", cfg.key_file] if port and cfg.key_file else [])  # the engine key (engine_key.py)
            + pd_argv.sglang_flags(req, cfg.bootstrap_port if port else None)
            + (_switch(u, CACHE_REPORT["sglang"]) if port else [])
            + nodes + list(u))


def llama_cpp_argv(req: LaunchRequest, port: int, cfg: EngineConfig) -> list[str]:
    u = req.backend_parameters
    split = req.tensor_split if req.tensor_split and len(req.tensor_split) > 1 else None
    return ([cfg.llama_server, "-m", _need_model(req), "--host", cfg.host, "--port", str(port)]
            + _ours(u, ("-ngl", "--gpu-layers", "--n-gpu-layers"),
                    str(req.offload_layers) if req.offload_layers is not None else None)
            + _ours(u, ("--tensor-split", "-ts"), ",".join(map(str, split)) if split else None)
            + _ours(u, ("--rpc",), ",".join(req.rpc_servers) if req.rpc_servers else None)
            + ["--alias", req.model]  # /v1/models then lists the deployment's name, as vLLM's and SGLang's do
            + list(u))


def llama_cpp_python_argv(req: LaunchRequest, port: int, cfg: EngineConfig) -> list[str]:
    """llama.cpp through llama-cpp-python's OpenAI-compatible server (same placement, its own
    flag names: scheduler/engine_flags/llama_cpp_python.py turns -c 2048 and --ctx-size=2048 into
    --n_ctx 2048, -fa on into --flash_attn true...). A flag it has none for (one an operator
    allowed past validation) is refused here, before the engine starts."""
    u, problems = llama_cpp_python.translate(list(req.backend_parameters), cfg.allow_engine_flags)
    if problems:
        raise LaunchRefused("; ".join(problems))
    split = req.tensor_split if req.tensor_split and len(req.tensor_split) > 1 else None
    return ([cfg.llama_cpp_python, "-m", "llama_cpp.server", "--model", _need_model(req), "--host", cfg.host,
             "--port", str(port)]
            + _ours(u, ("--n_gpu_layers",), str(req.offload_layers) if req.offload_layers is not None else None)
            + (["--tensor_split", *map(str, split)] if split and not params.has(u, "--tensor_split") else [])
            + _ours(u, ("--rpc_servers",), ",".join(req.rpc_servers) if req.rpc_servers else None)
            + ["--model_alias", req.model]
            + u)


def custom_argv(req: LaunchRequest, port: int | None, cfg: EngineConfig) -> list[str]:
    if not cfg.allow_custom:
        raise EngineUnavailable("custom run commands are not enabled on this host (start the agent with --allow-custom)")
    return build_argv(req.run_command or "", port, req.model_path, req.gpu_indexes, host=cfg.host,
                      kv_events_port=cfg.kv_events_port, api_key=cfg.api_key,
                      pd=PDWords(req.pd_role, cfg.kv_port, cfg.bootstrap_port))


def rpc_server_argv(req: LaunchRequest, port: int | None, cfg: EngineConfig, address: str) -> list[str]:
    return [cfg.rpc_server, "-H", address, "-p", str(port)]


def ray_head_argv(req: LaunchRequest, port: int | None, cfg: EngineConfig, address: str) -> list[str]:
    return [cfg.ray, "start", "--head", "--block", "--disable-usage-stats", "--node-ip-address", address,
            "--port", str(port), "--num-gpus", str(len(req.gpu_indexes))]


def ray_worker_argv(req: LaunchRequest, port: int | None, cfg: EngineConfig, address: str) -> list[str]:
    if not req.ray_address:
        raise InvalidInput("a Ray worker needs the head's address")
    return [cfg.ray, "start", "--block", "--disable-usage-stats", "--address", req.ray_address,
            "--node-ip-address", address, "--num-gpus", str(len(req.gpu_indexes))]


def sglang_node_argv(req: LaunchRequest, port: int | None, cfg: EngineConfig, address: str) -> list[str]:
    check_model_path(req.model_path, cfg.model_roots)
    return sglang_argv(req, None, cfg)


BUILDERS = {"vllm": vllm_argv, "sglang": sglang_argv, "llama.cpp": llama_cpp_argv, "custom": custom_argv}
HELPERS = {"rpc-server": rpc_server_argv, "ray-head": ray_head_argv, "ray-worker": ray_worker_argv,
           "sglang-node": sglang_node_argv}
WHAT = {"rpc-server": "llama.cpp's rpc-server", "ray-head": "ray", "ray-worker": "ray", "sglang-node": "sglang's Python"}


def kv_events_config(backend: str, port: int | None) -> str | None:
    """The engine's ``--kv-events-config`` value publishing on ``port`` (None: no port, no flag).
    vLLM binds only a wildcard endpoint (``tcp://*:P``; any other address it connects to); SGLang's
    config has no ``enable_kv_cache_events`` (a ``zmq`` publisher is the switch)."""
    if port is None:
        return None
    cfg = {"publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": "kv-events"}
    return json.dumps({"enable_kv_cache_events": True, **cfg} if backend == "vllm" else cfg, separators=(",", ":"))


def wants_kv_events(req: LaunchRequest, cfg: EngineConfig) -> bool:
    """Whether this launch gets an events port: a vLLM or SGLang server (rank 0) on an agent with
    ``--kv-events`` whose spec does not configure events itself, or a custom command naming
    ``{kv_events_port}``."""
    if req.role != "server":
        return False
    if req.backend == "custom":
        return "{kv_events_port}" in (req.run_command or "")
    return (cfg.kv_events and req.backend in ("vllm", "sglang")
            and not params.has(list(req.backend_parameters), "--kv-events-config"))


def needs_port(req: LaunchRequest) -> bool:
    if req.role != "server":
        return req.role not in ("ray-worker", "sglang-node")
    return req.backend != "custom" or "{port}" in (req.run_command or "")


def argv_for(req: LaunchRequest, port: int | None, cfg: EngineConfig, address: str = "127.0.0.1",
             kv_events_port: int | None = None, api_key: str | None = None, key_file: str | None = None,
             kv_port: int | None = None, bootstrap_port: int | None = None) -> list[str]:
    """The command that runs ``req`` (the server, or a helper bound to ``address``) on ``port``
    (publishing KV-cache events on ``kv_events_port``, when given: ``wants_kv_events``; answering
    only ``api_key``, a custom command's ``{api_key}``, or SGLang's ``key_file``; handing KV over on
    ``kv_port`` and ``bootstrap_port``, when given: pd_argv.ports_wanted);
    EngineUnavailable when this host cannot, LaunchRefused when it may not."""
    req = req.model_copy(update={"backend_parameters": check_launch(req, cfg)})
    if req.role != "server":
        helper = HELPERS.get(req.role)
        if helper is None:
            raise EngineUnavailable(f"role {req.role} has no launcher on this agent")
        argv = helper(req, port, cfg, address)
        if shutil.which(argv[0]) is None:
            raise EngineUnavailable(f"{WHAT[req.role]} is not installed on this host: {argv[0]!r} is not on PATH")
        return argv
    build = BUILDERS.get(req.backend)
    if build is None:
        raise EngineUnavailable(f"backend {req.backend} has no launcher on this agent")
    if req.distributed and not (req.rpc_servers or req.ray_address or req.nnodes):
        from contracts.launch_parts import unsupported

        raise EngineUnavailable(unsupported(req) or f"backend {req.backend}: the placement spans several workers "
                                "but no helper endpoints came with the launch")
    check_model_path(req.model_path, cfg.model_roots)
    cfg = replace(cfg, host=address, kv_events_port=kv_events_port, api_key=api_key, key_file=key_file,
                  kv_port=kv_port, bootstrap_port=bootstrap_port)
    if req.backend == "llama.cpp" and cfg.llama_cpp_python:
        build = llama_cpp_python_argv
    argv = build(req, port, cfg)
    if req.backend != "custom" and shutil.which(argv[0]) is None:
        raise EngineUnavailable(f"{req.backend} is not installed on this host: {argv[0]!r} is not on PATH")
    return argv


def engine_env(req: LaunchRequest) -> dict[str, str]:
    """Environment an engine needs beyond GPU visibility: vLLM over Ray finds its cluster by RAY_ADDRESS."""
    return {"RAY_ADDRESS": req.ray_address} if req.ray_address and req.role == "server" else {}
