"""Is it up? The agent's probes of the processes it starts: an engine's HTTP health (readiness and
liveness), a custom server's any-answer, a helper's (rpc-server, the Ray head) open port."""

from __future__ import annotations

import asyncio

from worker_agent.engine_key import bearer


def health_paths(backend: str) -> tuple[str, ...] | None:
    """What readiness and liveness ask: an engine's /health or its OpenAI-compatible /v1/models
    (200 from either); a custom server's / (any status: it answered)."""
    return None if backend == "custom" else ("/health", "/v1/models")


async def engine_answers(port: int, backend: str, timeout: float = 1.0, address: str = "127.0.0.1",
                         key: str | None = None) -> bool:
    """``key``: the engine key, shown to the engine (llama-cpp-python guards even /v1/models)."""
    paths = health_paths(backend)
    if paths is None:
        return await http_answers(port, timeout, address=address, key=key)
    for path in paths:
        if await http_answers(port, timeout, path, address, key):
            return True
    return False


async def tcp_answers(address: str, port: int, timeout: float = 1.0) -> bool:
    """True when address:port accepts a connection (rpc-server, the Ray head: not HTTP)."""
    try:
        _, w = await asyncio.wait_for(asyncio.open_connection(address, port), timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    w.close()
    return True


async def http_answers(port: int, timeout: float = 1.0, path: str | None = None, address: str = "127.0.0.1",
                       key: str | None = None) -> bool:
    """True when address:port (where the server listens) answers an HTTP request: with any
    status line when ``path`` is None (GET /), with 200 for ``path``; the request shows ``key``."""
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection(address, port), timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    try:
        auth = "".join(f"{k}: {v}\r\n" for k, v in bearer(key).items())
        w.write(f"GET {path or '/'} HTTP/1.0\r\nHost: {address}\r\n{auth}\r\n".encode())
        await w.drain()
        line = await asyncio.wait_for(r.readline(), timeout)
        if path is None:
            return line.startswith(b"HTTP/")
        parts = line.split()
        return len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1] == b"200"
    except (OSError, asyncio.TimeoutError):
        return False
    finally:
        w.close()
