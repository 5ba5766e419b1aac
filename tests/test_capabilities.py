"""The engines an agent reports (worker_agent/capabilities.py), found with real executables and
real Pythons: this test's interpreter has llama_cpp (llama-cpp-python) and no sglang."""

from __future__ import annotations

import stat
import sys

import pytest

from contracts.control import HostReport
from worker_agent.capabilities import python_has, runnable_backends, with_backends
from worker_agent.engines import EngineConfig


def executable(tmp_path, name: str) -> str:
    p = tmp_path / name
    p.write_text("#!/bin/sh\nexit 0\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


def test_python_has():
    assert python_has(sys.executable, "llama_cpp") and not python_has(sys.executable, "sglang")
    assert not python_has("/no/such/python", "json")


@pytest.mark.parametrize("flags, expected", [
    ({}, []),                                                       # nothing on PATH by these names, custom off
    ({"allow_custom": True}, ["custom"]),                           # custom only with --allow-custom
    ({"vllm": "VLLM", "llama_server": "LLAMA"}, ["vllm", "llama.cpp"]),  # executables given by flag
    ({"llama_cpp_python": sys.executable}, ["llama.cpp"]),          # a Python with llama_cpp
    ({"llama_cpp_python": "/no/such/python", "llama_server": "LLAMA"}, []),  # the launcher would use the Python
    ({"sglang_python": sys.executable}, []),                        # this Python has no sglang
])
def test_runnable_backends(tmp_path, flags, expected):
    base = {"vllm": str(tmp_path / "none-vllm"), "llama_server": str(tmp_path / "none-llama"),
            "sglang_python": str(tmp_path / "none-python")}
    real = {"VLLM": executable(tmp_path, "vllm"), "LLAMA": executable(tmp_path, "llama-server")}
    cfg = EngineConfig(**{**base, **{k: real.get(v, v) for k, v in flags.items()}})
    assert runnable_backends(cfg) == expected


@pytest.mark.parametrize("declared, found, reported", [
    (None, ["llama.cpp", "custom"], ["llama.cpp", "custom"]),  # no list in the inventory: what was found
    (["custom"], ["llama.cpp", "custom"], ["custom"]),        # the inventory file narrows
    (["vllm"], ["custom"], []),                               # and cannot add what is not there
])
def test_with_backends(declared, found, reported):
    r = HostReport(name="h", ram_total=1, backends=declared)
    assert with_backends(r, found).backends == reported
