"""Local TCP ports: a free one to listen on, and whether something listens on one. Shared by the
core (metrics endpoints), the dev stack and the tests; ``free_port`` has its home in the agent's
process helpers, which pick ports for the engines they start."""

from __future__ import annotations

import socket

from worker_agent.processes import free_port  # noqa: F401  (one home; gpuflow code imports it from here)


def port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex((host, port)) == 0
