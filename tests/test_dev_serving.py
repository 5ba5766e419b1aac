"""`gpuflow dev`'s serving options: --gateway-port, and the engine flags its agent gets (this
Python's llama-cpp-python server found without any)."""

from __future__ import annotations

import argparse
import sys

import pytest

from gpuflow.dev_serving import agent_engine_args, has_llama_cpp_server, parse_gateway_port


@pytest.mark.parametrize("given,port", [("8080", 8080), ("0", 0), ("off", 0), ("OFF", 0), ("65535", 65535)])
def test_gateway_port(given, port):
    assert parse_gateway_port(given) == port


@pytest.mark.parametrize("given,problem", [("http", "a port number or off"), ("70000", "is not a port"),
                                           ("-1", "is not a port")])
def test_gateway_port_refused(given, problem):
    with pytest.raises(argparse.ArgumentTypeError, match=problem):
        parse_gateway_port(given)


def flags(**kw) -> argparse.Namespace:
    base = {"vllm": None, "sglang_python": None, "llama_server": None, "llama_cpp_python": None}
    return argparse.Namespace(**{**base, **kw})


def test_this_python_serves_llama_cpp_without_flags():
    assert has_llama_cpp_server()  # llama-cpp-python[server] is a dependency of gpuflow
    assert agent_engine_args(flags()) == ["--llama-cpp-python", sys.executable]


@pytest.mark.parametrize("given,args", [
    ({"vllm": "/opt/vllm/bin/vllm"}, ["--vllm", "/opt/vllm/bin/vllm", "--llama-cpp-python", sys.executable]),
    ({"llama_server": "/usr/bin/llama-server"}, ["--llama-server", "/usr/bin/llama-server"]),  # theirs, not ours
    ({"llama_cpp_python": "/venv/bin/python"}, ["--llama-cpp-python", "/venv/bin/python"]),
    ({"sglang_python": "/sg/bin/python"}, ["--sglang-python", "/sg/bin/python", "--llama-cpp-python", sys.executable]),
])
def test_engine_flags_pass_through(given, args):
    assert agent_engine_args(flags(**given)) == args
