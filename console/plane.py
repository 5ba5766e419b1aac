"""What the console asks the control plane, as one seam: its actions (scale, delete, cordon, a key
made or revoked) and what only the workflows know (a replica's placement decision, a rollout, an
autoscaler's decisions). ``gpuflow gateway`` hands the console a plane that asks them through
Temporal exactly as the CLI does (gpuflow/gateway_seams.py ``TemporalPlane``: gpuflow/ops.py,
gpuflow/cluster_client.py), so every action is validated and recorded by the workflows, and the
console imports no Temporal client and no CLI module. A plane's InvalidInput is a refusal shown on
the page (400); its GpuflowError otherwise an outage (503)."""

from __future__ import annotations

from typing import Any, Protocol

from contracts.cluster import KeyView
from contracts.control import DeploymentView


class ControlPlane(Protocol):
    async def scale(self, deployment: str, replicas: int) -> DeploymentView:
        """``gpuflow scale``: the deployment's new view."""

    async def scale_role(self, deployment: str, role: str, replicas: int) -> DeploymentView:
        """``gpuflow scale --role``: one role of a prefill/decode group; the deployment's new view."""

    async def delete(self, deployment: str) -> DeploymentView:
        """``gpuflow delete`` (not waiting): the deployment's view, its replicas stopping."""

    async def cordon(self, host: str, on: bool, reason: str) -> str:
        """``gpuflow hosts cordon|uncordon``: what it did, in words."""

    async def explain(self, instance: str) -> dict[str, Any]:
        """``gpuflow explain NAME``'s dict: the replica's placement decision."""

    async def rollout(self, deployment: str) -> dict[str, Any]:
        """``gpuflow rollout status``'s dict."""

    async def autoscaler(self, deployment: str) -> dict[str, Any] | None:
        """``gpuflow autoscale``'s dict; None when it has no autoscaler; InvalidInput when its
        workflow cannot answer (failed, or its task failing), said without asking it."""

    async def create_key(self, tenant: str, name: str, scope: str) -> tuple[str, KeyView]:
        """``gpuflow keys create``: (the key, shown once; the control plane's record of it)."""

    async def revoke_key(self, key_id: str) -> KeyView:
        """``gpuflow keys revoke``: the revoked key's record."""
