"""Whom a message goes to: the run of one of the control plane's workflows, checked before it is asked.

Anyone who can reach Temporal can terminate a workflow and start one of their own with its id, on
a task queue they poll, and what that workflow answers would be taken for the control plane's word
(a host's booking, the ledger's bookings, a key made). So before an agent asks its host workflow or
the reads workflow, and before the CLI asks the cluster's workflows, the id's current run is
described once: its type must be the control plane's and its task queue ``gpuflow-control``, and the
message then goes to that run alone (a run started since is not asked in its place). A workflow of
the control plane's type started by somebody else runs the control plane's code: each checks its own
id against its input (workflows/guards.py ``workflow_id``), so it answers as the original would.

What this does not cover: a worker of somebody's own polling ``gpuflow-control`` (Temporal's own
authorization is what keeps the control plane's queue to its workers; docs/operations/security.md)."""

from __future__ import annotations

from datetime import timedelta

from temporalio.client import Client, WorkflowExecutionDescription, WorkflowHandle

from contracts.timings import CONTROL_QUEUE
from scheduler.errors import GpuflowError


class NotControlPlane(Exception):
    """The id is held by a workflow that is not the control plane's (its words name it)."""


class Squatted(GpuflowError):
    """What the CLI reports for NotControlPlane (exit 2): the id, whose it is, how to look."""


def squatted(why: str, workflow_id: str) -> Squatted:
    return Squatted(f"{why}: somebody's workflow holds its id, and gpuflow asks it nothing (`temporal workflow "
                    f"describe --workflow-id {workflow_id}` shows whose it is; terminating it frees the id)")


async def control_run(client: Client, workflow_id: str, workflow_type: str,
                      rpc_timeout: timedelta | None = None) -> WorkflowHandle:
    """The handle of ``workflow_id``'s current run, once described as a ``workflow_type`` on the
    control plane's queue; NotControlPlane naming what holds the id otherwise. Temporal's own errors
    (no such workflow, no answer) pass through."""
    run = await client.get_workflow_handle(workflow_id).describe(rpc_timeout=rpc_timeout)
    why = problem(run, workflow_id, workflow_type)
    if why:
        raise NotControlPlane(why)
    return client.get_workflow_handle(workflow_id, run_id=run.run_id)


def problem(run: WorkflowExecutionDescription, workflow_id: str, workflow_type: str) -> str | None:
    """Why the described ``run`` of ``workflow_id`` is not the control plane's ``workflow_type``
    (None: it is), for a caller that described it already."""
    if run.workflow_type == workflow_type and run.task_queue == CONTROL_QUEUE:
        return None
    return (f"{workflow_id} is a {run.workflow_type} on {run.task_queue!r}, not the control plane's "
            f"{workflow_type} on {CONTROL_QUEUE!r}")
