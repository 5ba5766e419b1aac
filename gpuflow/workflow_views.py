"""Views read from a workflow's own query, through Temporal: a deployment's rollout (``gpuflow
rollout status``) and an autoscaler's last decisions (``gpuflow autoscale``, the lines ``status``
adds). The web console shows the same, asked through its control-plane seam
(gpuflow/gateway_seams.py ``TemporalPlane``). What is read from the store is views/'s."""

from __future__ import annotations

from typing import Any

from temporalio.client import Client
from temporalio.service import RPCError

from contracts.ids import AUTOSCALER_VIEW, DEPLOYMENT_ROLLOUT, autoscaler_id
from gpuflow import ops
from scheduler.errors import InvalidInput


async def rollout_view(client: Client, name: str) -> dict[str, Any]:
    """The running deployment ``name``'s rollout: its progress, steps and kept versions
    (workflows/rollout_steps.py); InvalidInput when there is no such deployment."""
    h = await ops.deployment_handle(client, name)
    return await h.query(DEPLOYMENT_ROLLOUT)


async def autoscale_view(client: Client, name: str) -> dict[str, Any] | None:
    """The ``autoscale`` query of ``autoscaler/NAME``: its last decisions and why; None when it
    cannot be asked (no autoscaler, or Temporal refused)."""
    try:
        return await client.get_workflow_handle(autoscaler_id(name)).query(AUTOSCALER_VIEW)
    except RPCError:
        return None


async def autoscaler(client: Client, name: str) -> dict[str, Any] | None:
    """``autoscale_view``, once Temporal's description says the workflow can answer: one failed or
    stuck is said at once (InvalidInput naming why), never queried (that query hung about 30 s)."""
    why = (await ops.autoscalers(client, [name])).get(name)
    if why:
        raise InvalidInput(f"autoscaler/{name} cannot answer: {why}")
    return await autoscale_view(client, name)
