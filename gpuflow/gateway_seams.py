"""What ``gpuflow gateway`` hands the gateway and its web console, both through Temporal: the
autoscaler's wake (gateway/wake.py's ``Wake``) and the console's control plane (console/plane.py's
``ControlPlane``). They share one Temporal client (``Temporal.client``), connected on first use
from the gateway's Temporal settings (``--address`` or GPUFLOW_TEMPORAL__*): a gateway whose
Temporal is away still serves, and its console still shows the store's view.

The plane asks exactly what the CLI asks (gpuflow/ops.py, gpuflow/cluster_client.py,
gpuflow/workflow_views.py), so the console's actions are validated and recorded by the workflows
as the CLI's are."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.client import Client

from contracts.cluster import KeyView
from contracts.control import DeploymentView
from contracts.ids import AUTOSCALER_WAKE, autoscaler_id
from gpuflow import cluster_client, ops, workflow_views
from gpuflow.runtime import connect
from gpuflow.settings import TemporalSettings
from scheduler.errors import InvalidInput

CONNECT_S = 5.0


class Temporal:
    """One Temporal client for the gateway's process, connected on first use."""

    def __init__(self, settings: TemporalSettings):
        self.settings = settings
        self.client: Client | None = None  # None until first asked
        self.lock = asyncio.Lock()

    async def get(self) -> Client:
        """The client; InvalidInput (shown on a console page) when Temporal does not answer
        within CONNECT_S."""
        if self.client is not None:
            return self.client
        async with self.lock:
            if self.client is None:
                try:
                    self.client = await connect(self.settings, wait_s=CONNECT_S)
                except Exception as e:  # noqa: BLE001  said on the page; the rest of the console works
                    raise InvalidInput(f"Temporal at {self.settings.address} did not answer: {e}") from None
        return self.client


class TemporalWake:
    """gateway/wake.py's seam: the ``wake`` signal to the deployment's ``autoscaler/<name>``."""

    def __init__(self, temporal: Temporal):
        self.temporal = temporal

    async def wake(self, model: str) -> None:
        client = await self.temporal.get()
        await client.get_workflow_handle(autoscaler_id(model)).signal(AUTOSCALER_WAKE)


class TemporalPlane:
    """console/plane.py's ``ControlPlane``, asked as the CLI asks it."""

    def __init__(self, temporal: Temporal):
        self.temporal = temporal

    async def scale(self, deployment: str, replicas: int) -> DeploymentView:
        return await ops.scale(await self.temporal.get(), deployment, replicas)

    async def scale_role(self, deployment: str, role: str, replicas: int) -> DeploymentView:
        from gpuflow import group_ops

        return await group_ops.scale_role(await self.temporal.get(), deployment, role, replicas)

    async def delete(self, deployment: str) -> DeploymentView:
        return await ops.delete(await self.temporal.get(), deployment)

    async def cordon(self, host: str, on: bool, reason: str) -> str:
        return await ops.cordon(await self.temporal.get(), host, on, reason)

    async def explain(self, instance: str) -> dict[str, Any]:
        return await ops.explain(await self.temporal.get(), instance)

    async def rollout(self, deployment: str) -> dict[str, Any]:
        return await workflow_views.rollout_view(await self.temporal.get(), deployment)

    async def autoscaler(self, deployment: str) -> dict[str, Any] | None:
        return await workflow_views.autoscaler(await self.temporal.get(), deployment)

    async def create_key(self, tenant: str, name: str, scope: str) -> tuple[str, KeyView]:
        return await cluster_client.create_key(await self.temporal.get(), tenant, name, scope)

    async def revoke_key(self, key_id: str) -> KeyView:
        return await cluster_client.revoke_key(await self.temporal.get(), key_id)
