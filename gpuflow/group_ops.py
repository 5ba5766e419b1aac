"""A prefill/decode group's operations through Temporal, beside gpuflow/ops.py's: one role's scale
(the deployment's ``scale_role`` update). The group's part of ``status`` is views/group_status.py."""

from __future__ import annotations

from pydantic import ValidationError
from temporalio.client import Client

from contracts.control import DeploymentView
from contracts.group import DEPLOYMENT_SCALE_ROLE, RoleScaleAsk
from gpuflow.ops import deployment_handle, run_update
from scheduler.errors import InvalidInput
from views.group_status import roles_of  # noqa: F401  (the CLI's)


async def scale_role(client: Client, name: str, role: str, replicas: int) -> DeploymentView:
    """Set one role's replicas; its other members keep running (no restart). Refused, naming why,
    for a deployment without roles, a role the group lacks, or a count the role cannot take."""
    try:
        ask = RoleScaleAsk(role=role, replicas=replicas)
    except ValidationError as e:
        raise InvalidInput(f"scale {name} {replicas} --role {role}: {e.errors()[0]['msg']}") from None
    h = await deployment_handle(client, name)
    got = await run_update(h, DEPLOYMENT_SCALE_ROLE, ask)
    return got if isinstance(got, DeploymentView) else DeploymentView.model_validate(got)
