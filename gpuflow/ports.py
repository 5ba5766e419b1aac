"""Local TCP ports: a free one to listen on (``server_port``: one below the ephemeral range, for a
Temporal dev server a test or bench starts), and whether something listens on one. Shared by the
core (metrics endpoints), the dev stack and the tests; ``free_port`` has its home in the agent's
process helpers, which pick ports for the engines they start."""

from __future__ import annotations

import random
import socket

from worker_agent.processes import free_port  # noqa: F401  (one home; gpuflow code imports it from here)

LOWEST = 10000  # below this, well-known services
# Ports a browser refuses to open (the Fetch standard's "bad ports", net::ERR_UNSAFE_PORT in Chromium)
# at or above LOWEST: a console or gateway a test or an operator opens in a browser must not get one.
BROWSER_BAD_PORTS = frozenset({10080})


def ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """The first port of the kernel's ephemeral range (what a bind to port 0 gets); 32768 where
    the kernel does not say."""
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def server_port(host: str = "127.0.0.1", tries: int = 200) -> int:
    """A free port below the kernel's ephemeral range, for a Temporal dev server that a test or a
    bench starts. That server picks ports for its internal services itself, with binds to port 0,
    from the ephemeral range; a frontend port taken from that range too (``free_port``) was once
    handed to its worker service as well, which then failed to bind it and the server crashed
    after it had started listening. A port outside the range is never handed out that way. A port
    a browser refuses (``BROWSER_BAD_PORTS``) is never picked: the console's browser tests once got
    10080 for the gateway, and Chromium would not load the page."""
    high = ephemeral_low()
    if high - LOWEST < 1000:  # a kernel with a wide ephemeral range: nothing below it to pick from
        return free_port()
    for _ in range(tries):
        port = random.randrange(LOWEST, high)
        if port in BROWSER_BAD_PORTS:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        return port
    raise OSError(f"no free port between {LOWEST} and {high} after {tries} tries")


def port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex((host, port)) == 0
