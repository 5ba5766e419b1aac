"""What ``gpuflow dev`` needs to serve models out of the box: the engines this Python environment
has (llama-cpp-python's server, found without flags), engine options passed through to its agent,
and its gateway (``gpuflow gateway`` as a child process) with the base URL users point clients at."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time


ENGINE_FLAGS = ("--vllm", "--sglang-python", "--llama-server", "--llama-cpp-python")


def has_llama_cpp_server() -> bool:
    """llama-cpp-python's OpenAI-compatible server is importable here: the package with its
    ``server`` module and the ``[server]`` extra's web stack. Found, not imported (loading
    llama.cpp's shared library takes a while)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return False
    server = any(os.path.exists(os.path.join(d, "server", "__main__.py")) for d in spec.submodule_search_locations)
    return server and all(importlib.util.find_spec(m) is not None for m in ("uvicorn", "fastapi", "sse_starlette"))


def agent_engine_args(a) -> list[str]:
    """The dev agent's engine flags: the ones given to ``gpuflow dev`` (same names as the agent's),
    and, unless one was, this Python for llama.cpp models when it has llama-cpp-python's server."""
    out: list[str] = []
    for flag in ENGINE_FLAGS:
        v = getattr(a, flag.lstrip("-").replace("-", "_"), None)
        if v:
            out += [flag, v]
    if not a.llama_cpp_python and not a.llama_server and has_llama_cpp_server():
        out += ["--llama-cpp-python", sys.executable]
    for flag in getattr(a, "allow_engine_flag", None) or ():
        out += ["--allow-engine-flag", flag]
    return out


def add_engine_flags(p) -> None:
    g = p.add_argument_group("engines of the local agent (as `gpuflow agent` takes them)")
    g.add_argument("--vllm", help="the vllm executable")
    g.add_argument("--sglang-python", help="the Python that has sglang installed")
    g.add_argument("--llama-server", help="llama.cpp's llama-server (default: this Python's llama-cpp-python "
                                          "server when it is installed)")
    g.add_argument("--llama-cpp-python", help="a Python with llama-cpp-python[server] (default: this one, when it has it)")
    g.add_argument("--allow-engine-flag", action="append", metavar="FLAG",
                   help="let specs pass this engine flag beyond the engine's list (repeatable; as `gpuflow agent` "
                        "takes it)")


def parse_gateway_port(v: str) -> int:
    """--gateway-port: a port, or 0/off for no gateway."""
    import argparse

    if v.lower() in ("off", "no", "none"):
        return 0
    try:
        port = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gateway-port takes a port number or off, got {v!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"--gateway-port {port} is not a port (0-65535; 0 or off: no gateway)")
    return port


def gateway_argv(listen: str, database_url: str, temporal_address: str, temporal_ui: str | None = None) -> list[str]:
    """``gpuflow gateway`` against this stack; its console links replicas to ``temporal_ui`` (none: no link)."""
    return [sys.executable, "-m", "gpuflow", "gateway", "--listen", listen, "--database-url", database_url,
            "--address", temporal_address, "--temporal-ui-url", temporal_ui or ""]


def wait_listening(proc: subprocess.Popen, host: str, port: int, log: str, timeout: float = 60.0) -> str | None:
    """None once this gateway answers its ``/healthz`` on ``host:port``; otherwise why not (the
    process ended, or the time ran out), naming the log. An open port alone is not enough: another
    process that took the port between its pick and the gateway's bind (a Temporal server binds its
    internal services to ports of the kernel's choosing) would pass for it, while the gateway itself
    exits on 'address already in use'."""
    deadline = time.monotonic() + timeout
    while not _is_gateway(host, port):  # refused, too, until it listens
        if proc.poll() is not None:
            return f"the gateway exited with code {proc.returncode}; see {log}"
        if time.monotonic() > deadline:
            return f"the gateway did not listen on {host}:{port} within {timeout:g} s; see {log}"
        time.sleep(0.2)
    return None


def _is_gateway(host: str, port: int) -> bool:
    """``/healthz`` at host:port is a gpuflow gateway's: JSON naming its ``gateway`` (200 once its
    table is read, 503 before). Asked directly, never through a proxy the environment names."""
    import http.client
    import json

    target = "127.0.0.1" if host in ("0.0.0.0", "") else ("::1" if host == "::" else host.strip("[]"))
    conn = http.client.HTTPConnection(target, port, timeout=2)
    try:
        conn.request("GET", "/healthz")
        body = conn.getresponse().read()
    except (OSError, http.client.HTTPException):  # not HTTP (a gRPC server's answer), refused, reset or slow
        return False
    finally:
        conn.close()
    try:
        return "gateway" in json.loads(body)
    except (ValueError, TypeError):
        return False
