"""Stand-in prefill/decode engines as real processes (``gpuflow standin`` with a simulated GPU,
gpuflow/demo/standin_pd.py), for the PD tests and bench/bench_pd.py."""

from __future__ import annotations

import sys

import httpx2 as httpx

from gpuflow.ports import server_port
from tests.gateway_stack import Proc

FAST = {"token_s": 0.002, "prefill_token_s": 0.00002}  # a test's timings: 2 ms a decode step, 50k prompt tokens/s


def standin(role: str | None, name: str = "standin", key: str | None = None, log: str | None = None,
            **flags) -> Proc:
    """A stand-in engine on the simulated GPU: ``role`` prefill|decode (None: aggregated); ``flags``
    are its options (token_s, prefill_token_s, prefill_chunk, kv_blocks, kv_hold_s, kv_token_s, ...).
    A prefill gets a side channel (``proc.kv_port``); ``proc.engine_id`` is its id."""
    port = server_port()
    args = ["--port", str(port), "--model-name", name]
    kv_port = server_port() if role == "prefill" else None
    args += ["--pd-role", role] if role else ["--sim-gpu"]
    args += ["--kv-port", str(kv_port)] if kv_port else []
    for k, v in {**FAST, **flags}.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    args += ["--api-key", key] if key else []
    p = Proc([sys.executable, "-m", "gpuflow", "standin", *args], port, log=log)
    p.kv_port = kv_port
    p.name = name
    p.engine_id = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()["engine_id"]
    return p


def metrics(p: Proc, key: str | None = None) -> str:
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"http://127.0.0.1:{p.port}/metrics", headers=auth, timeout=10).text
