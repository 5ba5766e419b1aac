"""The rollout's look at its replicas: each instance workflow's state (its ``status`` query) and,
for a RUNNING one, whether its server answers HTTP on its advertised address. The deployment
workflow calls this between rollout steps (workflows/rollout_steps.py); the decision itself is
scheduler/rollout.py's, a pure function of what this returns."""

from __future__ import annotations

import asyncio

import aiohttp
from temporalio import activity
from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.service import RPCError

from contracts.ids import INSTANCE_STATUS, instance_id
from contracts.control import InstanceNames
from contracts.rollout import ROLLOUT_PROBE, ReplicaProbe, ReplicaProbes

HTTP_TIMEOUT_S = 3.0
MAX_NAMES = 2000
QUERY_S = 10.0  # a workflow that does not answer in this long counts as gone for this look


async def answers(address: str | None, port: int | None) -> bool:
    if not address or not port:
        return False
    host = f"[{address}]" if ":" in address else address
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)) as s:
            async with s.get(f"http://{host}:{int(port)}/health") as r:
                return r.status < 500
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
        return False


class RolloutProbe:
    def __init__(self, client: Client):
        self.client = client

    def all(self) -> list:
        return [self.rollout_probe]

    @activity.defn(name=ROLLOUT_PROBE)
    async def rollout_probe(self, asked: InstanceNames) -> ReplicaProbes:
        """Each named replica's state and whether its server answers (the first MAX_NAMES)."""
        out = []
        for n in asked.names[:MAX_NAMES]:
            activity.heartbeat()
            try:
                v = await asyncio.wait_for(self.client.get_workflow_handle(instance_id(n)).query(INSTANCE_STATUS), QUERY_S)
            except (RPCError, WorkflowQueryFailedError, asyncio.TimeoutError) as e:
                out.append(ReplicaProbe(name=n, state="gone", reason=str(e)[:200]))
                continue
            v = v if isinstance(v, dict) else {}
            state = str(v.get("state", "unknown"))
            ok = state == "running" and await answers(v.get("address"), v.get("port"))
            out.append(ReplicaProbe(name=n, state=state, reason=str(v.get("reason", ""))[:300],
                                    restarts=int(v.get("restarts") or 0), answers=ok))
        return ReplicaProbes(probes=out)
