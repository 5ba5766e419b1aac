"""Where a replica's log is once it holds no placement, and the last lines of a failed one's.

A replica that gave up (ERROR: the spec's fault) or ended (deleted, scaled away) holds no
placement, so its status names no worker; its log is still on the host that ran it, kept there
until the agent's ``--keep-logs`` retention drops it (worker_agent/log_reader.py). That host is
read off the instance workflow's own history: the task queue of the last launch of that process
(``gpuflow-host-<worker>``), else the placement its run was continued with. Reading a history is
one call to Temporal and changes nothing.

The last lines of a failed replica's log in ``gpuflow status``: gpuflow/status_logs.py. A chunk
of any replica's log, read on its host (``gpuflow logs``): ``read_log``.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.service import RPCError, RPCStatusCode

from contracts.agent import LAUNCH_INSTANCE, LogChunk, LogRequest, instance_of
from contracts.host import host_queue
from contracts.ids import instance_id
from gpuflow.runtime import Unreachable
from scheduler.errors import InvalidInput

QUEUE_PREFIX = host_queue("")
TAIL_LINES = 5
LOG_QUERY_TIMEOUT_S = 15.0


def host_of_queue(queue: str) -> str | None:
    return queue[len(QUEUE_PREFIX):] or None if queue.startswith(QUEUE_PREFIX) else None


async def last_host(client: Client, key: str) -> str | None:
    """The host of the last launch of process ``key`` (an instance, or instance@part) in its
    instance workflow's latest run; else the worker of the placement that run started with."""
    handle = client.get_workflow_handle(instance_id(instance_of(key)))
    conv = client.data_converter
    found = started = None
    async for ev in handle.fetch_history_events():
        if ev.HasField("workflow_execution_started_event_attributes"):
            args = await conv.decode(ev.workflow_execution_started_event_attributes.input.payloads)
            plan = (args[0] or {}).get("placement") if args and isinstance(args[0], dict) else None
            started = plan.get("worker") if isinstance(plan, dict) else None
        elif ev.HasField("activity_task_scheduled_event_attributes"):
            a = ev.activity_task_scheduled_event_attributes
            if a.activity_type.name != LAUNCH_INSTANCE:
                continue
            args = await conv.decode(a.input.payloads)
            req = args[0] if args and isinstance(args[0], dict) else {}
            part = req.get("part") or ""
            if (f"{req.get('instance')}@{part}" if part else req.get("instance")) == key:
                found = host_of_queue(a.task_queue.name) or found
    return found or (started if key == instance_of(key) else None)


def tail_lines(text: str, n: int = TAIL_LINES) -> list[str]:
    """The last ``n`` lines of a log's end, gpuflow's own '--- gpuflow:' markers left out."""
    return [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("--- gpuflow")][-n:]


async def log_host(client: Client, name: str) -> str:
    """The host that keeps ``name``'s log: the instance's worker, or for a helper process
    (instance@part: an rpc-server, a Ray node) the worker that runs that part."""
    from gpuflow.ops import instance

    base = instance_of(name)
    v = await instance(client, base)
    worker = v.parts.get(name) if base != name else v.worker
    if worker is None:  # ended or given up: its log stays on the host that last ran it
        worker = await last_host(client, name)
    if worker is None:
        if base == name:
            raise InvalidInput(f"instance {base} was never launched on a host ({v.state}{': ' + v.reason if v.reason else ''}), "
                               "so it has no log")
        raise InvalidInput(f"{base} has no part {name} (its parts: {', '.join(sorted(v.parts)) or 'none'})")
    return worker


async def read_log(client: Client, instance_name: str, offset: int = -4096, worker: str | None = None):
    """One chunk of an instance's log, read on its host by the agent's ``read_log`` query
    (worker_agent/log_reader.py): nothing is started and no history grows."""
    from worker_agent.log_reader import QUERY, workflow_id

    worker = worker or await log_host(client, instance_name)
    handle = client.get_workflow_handle(workflow_id(worker))
    try:
        return await handle.query(QUERY, LogRequest(instance=instance_name, worker=worker, offset=offset),
                                  result_type=LogChunk, rpc_timeout=timedelta(seconds=LOG_QUERY_TIMEOUT_S))
    except WorkflowQueryFailedError as e:
        raise InvalidInput(f"cannot read {instance_name}'s log on {worker}: {e}") from None
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise Unreachable(f"host {worker} has no log reader: is its agent running "
                              f"(gpuflow agent --name {worker})?") from None
        if e.status in (RPCStatusCode.FAILED_PRECONDITION, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED,
                        RPCStatusCode.UNAVAILABLE):  # FAILED_PRECONDITION: "no poller seen for task queue recently"
            raise Unreachable(f"cannot read {instance_name}'s log: host {worker} did not answer ({e.message}); "
                              "is its agent running?") from None
        raise
