"""Which engines this host can run, as its inventory's ``backends``: found once at agent start,
where the agent's flags say each engine is (or on PATH), so the scheduler never places a model
on a host that cannot launch it.

| backend | reported when |
| --- | --- |
| vllm | ``--vllm`` (default ``vllm``) is an executable on PATH or a path |
| sglang | ``--sglang-python`` (default ``python3``) imports ``sglang`` |
| llama.cpp | ``--llama-cpp-python PY`` given: PY imports ``llama_cpp``; otherwise ``--llama-server`` is found |
| custom | ``--allow-custom`` |

An inventory file's ``backends`` can only narrow this list (a host of simulated GPUs still
launches real processes). A report without ``backends`` (an older agent) means unknown, as in
GPUStack: the backend filter then keeps the host.

Beside the engines, what a launch starts here (``runs``: real processes, or nothing under
``gpuflow simulate``) and, where custom commands run as processes, the executables on the agent's
PATH (``path_commands``: scheduler/command_set.py), so that a spec whose command is not on a host
waits for one that has it instead of going ERROR there (scheduler/filters/command.py); and the
KV connectors its engines can run, for prefill/decode groups (kv_connectors.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess

from contracts.host import HostReport
from scheduler.command_set import encode
from worker_agent.engines import EngineConfig
from worker_agent.kv_connectors import found_connectors, reported

_FIND = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 1)"


def python_has(python: str, module: str, timeout_s: float = 60.0) -> bool:
    """Whether ``python`` (on PATH or a path) can import ``module`` (found, not imported)."""
    exe = shutil.which(python)
    if exe is None:
        return False
    try:
        return subprocess.run([exe, "-c", _FIND, module], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=timeout_s).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def runnable_backends(cfg: EngineConfig) -> list[str]:
    found = []
    if shutil.which(cfg.vllm):
        found.append("vllm")
    if python_has(cfg.sglang_python, "sglang"):
        found.append("sglang")
    if python_has(cfg.llama_cpp_python, "llama_cpp") if cfg.llama_cpp_python else shutil.which(cfg.llama_server):
        found.append("llama.cpp")
    if cfg.allow_custom:
        found.append("custom")
    return found


def host_engines(cfg: EngineConfig, runs: str) -> tuple[list[str], list[str] | None]:
    """The engines found here, and the KV connectors they find (kv_connectors.py; None: not known,
    and not looked for where launches start nothing)."""
    runnable = runnable_backends(cfg)
    return runnable, (found_connectors(cfg, runnable) if runs == "processes" else None)


def with_backends(report: HostReport, runnable: list[str]) -> HostReport:
    """The report with ``backends`` = what this host runs (narrowed by the inventory file's list)."""
    keep = runnable if report.backends is None else [b for b in runnable if b in report.backends]
    return report.model_copy(update={"backends": keep})


def path_commands(path: str | None) -> str | None:
    """The executables in the folders of ``path`` (a PATH), as a command set; None when there
    is no PATH or too many names to report (scheduler/command_set.py MAX_CHARS)."""
    names: set[str] = set()
    for folder in (path or "").split(os.pathsep):
        try:
            with os.scandir(folder or ".") as entries:
                names.update(e.name for e in entries if _executable(e))
        except OSError:  # a folder that is gone or unreadable holds nothing this agent can start
            continue
    return encode(names) if path else None


def _executable(entry: os.DirEntry) -> bool:
    try:
        return entry.is_file() and os.access(entry.path, os.X_OK)
    except OSError:
        return False


def with_capabilities(report: HostReport, runnable: list[str], runs: str, commands: str | None,
                      stated: list[str] | None = None, found: list[str] | None = None) -> HostReport:
    """The report with what this host runs: its engines (``with_backends``), what a launch starts
    (``runs``), where custom commands start processes the commands on its PATH, and the KV
    connectors its engines run: ``stated`` by the operator, else the inventory file's, else ``found``."""
    r = with_backends(report, runnable)
    keep = commands if runs == "processes" and "custom" in (r.backends or []) else None
    return r.model_copy(update={"runs": runs, "commands": keep,
                                "kv_connectors": reported(stated, r.kv_connectors, found, runs)})
