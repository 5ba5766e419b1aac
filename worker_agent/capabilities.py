"""Which engines this host can run, as its inventory's ``backends``: found once at agent start,
where the agent's flags say each engine is (or on PATH), so the scheduler never places a model
on a host that cannot launch it.

| backend | reported when |
| --- | --- |
| vllm | ``--vllm`` (default ``vllm``) is an executable on PATH or a path |
| sglang | ``--sglang-python`` (default ``python3``) imports ``sglang`` |
| llama.cpp | ``--llama-cpp-python PY`` given: PY imports ``llama_cpp``; otherwise ``--llama-server`` is found |
| custom | ``--allow-custom`` |

An inventory file's ``backends`` can only narrow this list (a simulated host still launches
real processes). A report without ``backends`` (an older agent) means unknown, as in GPUStack:
the backend filter then keeps the host.
"""

from __future__ import annotations

import shutil
import subprocess

from activities.payloads import HostReport
from worker_agent.engines import EngineConfig

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


def with_backends(report: HostReport, runnable: list[str]) -> HostReport:
    """The report with ``backends`` = what this host runs (narrowed by the inventory file's list)."""
    keep = runnable if report.backends is None else [b for b in runnable if b in report.backends]
    return report.model_copy(update={"backends": keep})
