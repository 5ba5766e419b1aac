"""Reading instance logs on this host, for ``gpuflow logs``, without an entry in any history.

Each agent keeps one workflow on its own task queue, ``host-logs/<worker>``, that does nothing
but wait; its ``read_log`` query is answered by this agent's worker, which reads the file here. A
query is not recorded in any history, so reading (or following) a log leaves no trace in the
audit trail: no workflow per read, no events on the host's or the instance's workflow. The
workflow is not sandboxed (its only work, the query, reads a file) and is deterministic: its one
command is to wait.

The name in a request arrives through Temporal, so it is untrusted: it must be an instance name,
or ``instance@part`` for a helper's log, and the resolved path must lie directly in this agent's
log folder (no ``..``, no '/', no symlink that leads elsewhere). Which logs are kept, and for how
long, is worker_agent/log_retention.py's.
"""

from __future__ import annotations

import os

from temporalio import workflow

from contracts.ids import host_logs_id
from scheduler.errors import InvalidInput
from contracts.agent import LogChunk, LogRequest
from worker_agent.engine_key import read_redacted
from worker_agent.log_retention import NAME as _NAME
from worker_agent.log_retention import KEEP_LOGS, prune_logs, prune_table_logs  # noqa: F401  (their home; re-exported)

QUERY = "read_log"
WORKFLOW = "HostLogsWorkflow"
MAX_BYTES = 1 << 20


def workflow_id(worker: str) -> str:
    return host_logs_id(worker)


def log_file(log_dir: str, key: str) -> str:
    """The log of process ``key`` (an instance, or instance@part), checked to lie in ``log_dir``."""
    inst, at, part = key.partition("@") if isinstance(key, str) else ("", "", "")
    if not _NAME.fullmatch(inst) or (at and not _NAME.fullmatch(part)) or len(key) > 240:
        raise InvalidInput(f"{key!r} is not an instance name (or INSTANCE@part): letters, digits, '.', '_', '-'")
    path = os.path.join(log_dir, f"{key}.log")
    if os.path.dirname(os.path.realpath(path)) != os.path.realpath(log_dir):
        raise InvalidInput(f"the log of {key!r} does not resolve inside the agent's log folder; refused")
    return path


def read_chunk(log_dir: str, req: LogRequest) -> LogChunk:
    """Up to ``max_bytes`` of the log from ``offset`` (negative: that far from the end). A read
    from the end starts at the next line boundary, so the first line shown is whole (unless no
    line starts in the window: then the tail of the last line beats nothing)."""
    path = log_file(log_dir, req.instance)
    limit = max(0, min(req.max_bytes, MAX_BYTES))
    try:
        size = os.path.getsize(path)
        start = max(0, size + req.offset) if req.offset < 0 else min(req.offset, size)
        with open(path, "rb") as f:
            if req.offset < 0 and start > 0:
                f.seek(start - 1)
                if f.read(1) != b"\n":  # mid-line: skip to the next line, if one starts in this window
                    cut = f.read(limit).find(b"\n")
                    start += cut + 1 if 0 <= cut < size - start - 1 else 0
            data, end = read_redacted(f, start, min(size, start + limit))  # engine keys starred (engine_key.py)
    except OSError:
        return LogChunk(text="", offset=max(req.offset, 0), found=False)
    return LogChunk(text=data.decode(errors="replace"), offset=end, found=True, more=end < size)


_LOG_DIRS: dict[str, str] = {}  # host task queue -> that agent's log folder (agents in this process)


@workflow.defn(name=WORKFLOW, sandboxed=False)
class HostLogsWorkflow:
    @workflow.run
    async def run(self, worker: str) -> None:
        await workflow.wait_condition(lambda: False)  # lives as long as the host; answers queries

    @workflow.query(name=QUERY)
    def read_log(self, req: LogRequest) -> LogChunk:
        # the folder is the agent's own, found by the queue this worker polls; nothing from the request
        return read_chunk(_LOG_DIRS[workflow.info().task_queue], req)


def logs_workflow(queue: str, log_dir: str) -> type:
    """The workflow class for an agent polling ``queue``: its query reads from ``log_dir`` only."""
    _LOG_DIRS[queue] = log_dir
    return HostLogsWorkflow


async def open_reader(client, worker: str, queue: str) -> None:
    """Start this host's log workflow, or keep the one already running (an agent restart)."""
    from temporalio.common import WorkflowIDConflictPolicy

    await client.start_workflow(WORKFLOW, worker, id=workflow_id(worker), task_queue=queue,
                                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                                static_summary=f"answers 'gpuflow logs' queries for host {worker}")
