"""Which KV connectors this host's engines can run, as its report's ``kv_connectors``: what a
prefill/decode group's member needs (scheduler/filters/pd_mode.py keeps a member off a host that
reports connectors without its mode's). Found once at agent start, beside the engines
(capabilities.py), unless the operator states it.

| where it comes from | when |
| --- | --- |
| ``--kv-connector NAME`` (repeatable) or ``GPUFLOW_AGENT__KV_CONNECTORS`` | given: exactly these |
| the inventory file's ``kv_connectors`` | given (and no flag): exactly these |
| found: the connectors whose package every engine's Python here finds | else, where launches start processes |

Only the names gpuflow knows (contracts/kv_connectors.py KV_CONNECTORS: ``nixl``, ``mooncake``) are taken
from the operator; any other is refused, named. Finding looks for the package each engine imports
for the connector (vLLM's NixlConnector imports ``nixl``; vLLM's and SGLang's Mooncake connectors
import ``mooncake``, from mooncake-transfer-engine) with ``importlib.util.find_spec`` (found, not
imported: nothing of it runs) in each interpreter the agent launches an engine with:
``--sglang-python`` where SGLang is found, and the Python named by the ``#!`` line of ``--vllm``
where vLLM is. A connector is reported only where every such engine finds it, so a group whose
mode's engine lacks it is never placed here for it. Nothing is reported (None: the filter keeps the
host) where no engine interpreter can be examined: no vLLM or SGLang here, a ``vllm`` that is not a
Python script, or ``gpuflow simulate``'s hosts, which start nothing. The packages' presence is not
a working transport (RDMA devices, UCX): the operator's flag states what detection cannot see.
"""

from __future__ import annotations

import re
import shutil
import subprocess

from worker_agent.engines import EngineConfig

# connector -> the Python package the engines import for it
MODULES = {"nixl": "nixl", "mooncake": "mooncake"}
PD_ENGINES = ("vllm", "sglang")  # the engines whose PD modes name a connector (scheduler/groups/spec.py)
_FIND = ("import importlib.util, sys\n"
         "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is not None))")
# a console script's interpreter: "#!/venv/bin/python3", "#!/usr/bin/env python3", or pip's
# "#!/bin/sh" + "'''exec' /long path/bin/python3 "$0" "$@"" for paths a #! line cannot hold
_SHEBANG = re.compile(r"#!\s*(\S+)(?:\s+(\S+))?")
_SH_EXEC = re.compile(r"'''exec' \"?([^\"]+?)\"? \"\$0\"")
_PYTHON = re.compile(r"python[0-9.]*")


def script_python(executable: str) -> str | None:
    """The Python that runs ``executable`` (on PATH or a path), from its first lines; None when it
    is not found or not a Python script (a binary, a shell wrapper)."""
    path = shutil.which(executable)
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(1024).decode("utf-8", "replace").splitlines()[:2]
    except OSError:
        return None
    m = _SHEBANG.match(head[0]) if head else None
    if m is None:
        return None
    prog, arg = m.group(1), m.group(2)
    if prog.rsplit("/", 1)[-1] == "env" and arg and _PYTHON.fullmatch(arg):
        return arg
    if _PYTHON.fullmatch(prog.rsplit("/", 1)[-1]):
        return prog
    sh = _SH_EXEC.match(head[1]) if len(head) > 1 else None
    return sh.group(1) if sh and _PYTHON.fullmatch(sh.group(1).rsplit("/", 1)[-1]) else None


def engine_pythons(cfg: EngineConfig, runnable: list[str]) -> list[str] | None:
    """The interpreters this host's PD engines run in (each once); None when one of them cannot be
    told, or there is none (what connectors they have is not known then)."""
    found: list[str | None] = []
    if "vllm" in runnable:
        found.append(script_python(cfg.vllm))
    if "sglang" in runnable:
        found.append(cfg.sglang_python)
    if not found or None in found:
        return None
    return list(dict.fromkeys(p for p in found if p))


def modules_found(python: str, modules: list[str], timeout_s: float = 60.0) -> set[str]:
    """Which of ``modules`` ``python`` finds (none when it cannot be run); only names asked count."""
    exe = shutil.which(python)
    if exe is None:
        return set()
    try:
        out = subprocess.run([exe, "-c", _FIND, *modules], stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return set(out.stdout.split()) & set(modules) if out.returncode == 0 else set()


def found_connectors(cfg: EngineConfig, runnable: list[str]) -> list[str] | None:
    """The connectors whose package every PD engine's interpreter here finds; None: not known."""
    pythons = engine_pythons(cfg, runnable)
    if pythons is None:
        return None
    have = set(MODULES)
    for py in pythons:
        mods = modules_found(py, sorted(MODULES.values()))
        have &= {c for c, m in MODULES.items() if m in mods}
    return sorted(have)


def reported(stated: list[str] | None, inventory: list[str] | None, found: list[str] | None,
             runs: str) -> list[str] | None:
    """What the report says: the operator's flag (or variable), else the inventory file's, else what
    was found where launches start processes (``runs``); None: not reported."""
    if stated is not None:
        return stated
    if inventory is not None:
        return inventory
    return found if runs == "processes" else None
