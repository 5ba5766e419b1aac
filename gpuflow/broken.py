"""A workflow that cannot make progress (its workflow task fails on every attempt, or it does not
answer) is reported as broken, and the commands that list or delete go on with the rest.

Queries to such a workflow fail ("Workflow Task in failed state") or hang, so ``status``,
``hosts`` and ``delete`` first ask Temporal's own description (which needs no worker) and bound
every query with a timeout."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from temporalio.client import Client, WorkflowExecutionDescription, WorkflowFailureError, WorkflowHandle

from contracts.ids import INSTANCE_STOP, INSTANCE_WORKFLOW
from contracts.timings import CONTROL_QUEUE
from gpuflow.runtime import Unreachable
from gpuflow.visibility import listed

QUERY_TIMEOUT_S = 10.0
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
FAILING_ATTEMPTS = 2  # a workflow task on its second attempt or later has failed at least once


async def task_failing(handle: WorkflowHandle) -> str | None:
    """Why the workflow cannot make progress, when it surely cannot: its workflow task keeps
    failing, or it runs on a task queue no gpuflow worker polls. Else None (a control plane
    that is merely down is not a broken deployment)."""
    return failing(await handle.describe(), handle.id)


def failing(d: WorkflowExecutionDescription, wid: str) -> str | None:
    """:func:`task_failing` from a description at hand."""
    queue = d.raw_description.execution_config.task_queue.name
    if queue and queue != CONTROL_QUEUE:
        return f"it runs on task queue {queue!r}, which no gpuflow worker polls (they poll {CONTROL_QUEUE!r})"
    pending = d.raw_description.pending_workflow_task
    if d.raw_description.HasField("pending_workflow_task") and pending.attempt >= FAILING_ATTEMPTS:
        return (f"its workflow task has failed {pending.attempt - 1} time(s) and is being retried; "
                f"the history of {wid} in the Temporal UI shows why")
    return None


async def closed(handle: WorkflowHandle, d: WorkflowExecutionDescription) -> str | None:
    """Why a workflow that is no longer running cannot answer a query at once, or None when it
    can be asked (running, or completed: its worker replays it). A query to one that failed, was
    terminated or timed out is not made: one started with an input it refused took about 30 s to
    give up on (``gpuflow status`` took 34 s instead of 2.5), so the failure is read from its
    history instead (one short read)."""
    st = d.status.name if d.status is not None else "GONE"
    if st in ("RUNNING", "COMPLETED"):
        return None
    if st == "FAILED":
        try:
            await asyncio.wait_for(handle.result(follow_runs=False), QUERY_TIMEOUT_S)
        except WorkflowFailureError as e:
            why = cause_message(e)
            return f"failed: {why.splitlines()[0][:300] if why else 'no reason given'}"
        except Exception as e:  # noqa: BLE001  the history could not be read: say what it is
            return f"failed ({reason(e)})"
        return "failed"
    return st.lower().replace("_", " ")


async def query(handle: WorkflowHandle, q, result_type: type | None = None, timeout_s: float | None = None) -> Any:
    """A query (a name from contracts/ids.py, answered as ``result_type``; or a workflow's method)
    that gives up after ``timeout_s`` (default QUERY_TIMEOUT_S), naming the workflow."""
    timeout_s = QUERY_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        return await asyncio.wait_for(handle.query(q, result_type=result_type), timeout_s)
    except asyncio.TimeoutError:
        raise Unreachable(f"{handle.id} did not answer a query within {timeout_s:g} s "
                           "(is a control-plane worker running? its history in the Temporal UI says more)") from None


def cause_message(e: BaseException) -> str:
    """The innermost cause's message of a failure (a workflow's or an update's): Temporal wraps an
    activity's ApplicationError ("role prefill: ...: no config.json") in an ActivityError whose
    message is only "Activity task failed"; a wrapper's own message only where nothing inside has one."""
    said, c, seen = "", e, 0
    while c is not None and seen < 32:  # a chain of causes, bounded
        said = getattr(c, "message", None) or said or str(c)
        c, seen = getattr(c, "cause", None), seen + 1
    return said or type(e).__name__


def reason(e: BaseException) -> str:
    """One line for a failed query or describe: the server's or the handler's message."""
    msg = getattr(e, "message", None) or str(e) or type(e).__name__
    return msg.splitlines()[0][:300]


async def stop_instances_of(client: Client, deployment: str) -> list[str]:
    """Signal ``stop`` to every running instance workflow of ``deployment`` (found by search
    attribute, not through the deployment, which may not answer); their names."""
    if not NAME.match(deployment):
        return []
    q = (f"WorkflowType = '{INSTANCE_WORKFLOW}' AND ExecutionStatus = 'Running' "
         f"AND GpuflowDeployment = '{deployment}'")
    names = []
    for wid in await listed(client, q):  # ids only (gpuflow/visibility.py)
        try:
            await client.get_workflow_handle(wid).signal(INSTANCE_STOP)
            names.append(wid.split("/", 1)[1])
        except Exception:  # noqa: BLE001  ended meanwhile
            pass
    return sorted(names)
