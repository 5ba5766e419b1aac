"""The last lines of each ERROR replica's log, for ``gpuflow status``: read on its host the way
``gpuflow logs`` reads them (the agent's log query: no history grows), the host found as
gpuflow/instance_logs.py finds it. A host that does not answer within TAIL_TIMEOUT_S leaves the
replica shown with its reason alone: status never waits on a host."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.client import Client

from gpuflow import ops
from gpuflow.instance_logs import last_host, read_log, tail_lines

TAIL_BYTES = 4096
TAIL_TIMEOUT_S = 5.0


async def error_tails(client: Client, st: dict[str, Any]) -> dict[str, Any]:
    """``st`` (ops.status) with ``log_tail`` (lines) on each ERROR replica whose host answers in
    time; one that does not is shown without (status never waits on a host)."""
    async def one(i: dict[str, Any]) -> None:
        try:
            worker = i.get("worker") or await last_host(client, i["name"])
            if not worker:
                return
            chunk = await asyncio.wait_for(read_log(client, i["name"], offset=-TAIL_BYTES, worker=worker),
                                           TAIL_TIMEOUT_S)
        except Exception:  # noqa: BLE001  the host away, or the log gone: the reason alone is shown
            return
        if chunk.found:
            i["log_tail"] = tail_lines(chunk.text)

    failed = [i for d in st.get("deployments", []) for i in d.get("instances", []) if i.get("state") == "error"]
    await ops.bounded([one(i) for i in failed])
    return st
