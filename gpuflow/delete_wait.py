"""What ``gpuflow delete --wait`` waits for: the deployment's workflow to end, then each of its
replicas' workflows to close.

A replica's workflow tells its deployment it has ended (``instance_ended``) as its last step, and
closes on its next workflow task. The deployment ends once each has told it, so a moment can pass,
longer on a loaded server, in which the deployment is gone and a replica's workflow still runs. A
deploy of the same name sent in that moment would find the old replica's workflow still holding
its id (``start_instances`` uses a running workflow as it is), and a workflow started under that id
would be refused as already running. ``delete --wait`` therefore returns once each replica's
workflow has closed, read from Temporal (describe, which is consistent, not visibility, which
lags)."""

from __future__ import annotations

import asyncio
from typing import Callable

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from contracts.deployment import DeploymentView
from contracts.ids import DEPLOYMENT_STATUS, instance_id
from gpuflow import broken
from gpuflow.runtime import Unreachable

AT_ONCE = 50  # describes in flight together: a deployment of 500 is read in ten rounds
CLOSE_S = 120.0  # after the deployment has ended: a replica's workflow has one workflow task left


async def still_running(client: Client, names: list[str]) -> list[str]:
    """Those of ``names`` whose replica's workflow runs now (none found counts as closed)."""
    running: list[str] = []
    for i in range(0, len(names), AT_ONCE):
        part = names[i:i + AT_ONCE]
        found = await asyncio.gather(*(_runs(client, n) for n in part))
        running += [n for n, runs in zip(part, found) if runs]
    return running


async def _runs(client: Client, name: str) -> bool:
    try:
        desc = await client.get_workflow_handle(instance_id(name)).describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return False
        raise  # Temporal did not answer: never read as closed
    return desc.status == WorkflowExecutionStatus.RUNNING


async def until_closed(client: Client, names: list[str], progress: Callable[[int], None] | None = None,
                       every_s: float = 5.0, poll_s: float = 0.2, limit_s: float = CLOSE_S) -> None:
    """Return once no workflow of ``names`` runs, reading them again every ``poll_s`` and telling
    ``progress`` how many are left every ``every_s``; Unreachable if some still run ``limit_s`` on."""
    left = sorted(set(names))
    loop = asyncio.get_running_loop()
    start = told = loop.time()
    while left := await still_running(client, left):
        now = loop.time()
        if now - start >= limit_s:
            named = ", ".join(instance_id(n) for n in left[:5]) + (", ..." if len(left) > 5 else "")
            raise Unreachable(f"the deployment was deleted, but {len(left)} replica workflow(s) had not closed "
                              f"{limit_s:.0f} s later ({named}): are the control-plane workers running? "
                              "The Temporal UI shows their histories")
        if progress is not None and now - told >= every_s:
            progress(len(left))
            told = now
        await asyncio.sleep(poll_s)


async def until_gone(client: Client, h: WorkflowHandle, asked: DeploymentView,
                     progress: Callable[[int], None] | None = None, every_s: float = 5.0) -> DeploymentView:
    """The deployment's last view, once its workflow (``h``) has ended and the workflows of the
    replicas it had when the delete was ``asked`` have closed; ``progress`` is told how many
    replicas are left every ``every_s`` meanwhile."""
    done = asyncio.ensure_future(h.result())
    while not done.done():
        try:
            await asyncio.wait_for(asyncio.shield(done), every_s)
        except asyncio.TimeoutError:
            if progress is None:
                continue
            try:
                left = await broken.query(h, DEPLOYMENT_STATUS, DeploymentView)
            except Exception:  # noqa: BLE001  ended meanwhile, or slow to answer: the result says
                continue
            progress(len(set(left.instances) | set(left.stopping)))
    await until_closed(client, asked.instances + asked.stopping, progress, every_s)
    return done.result()
