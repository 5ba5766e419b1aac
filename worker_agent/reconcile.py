"""The agent's orphan check: a process this agent started whose instance is gone, or whose
instance is now placed on other hosts, is stopped and reported (a log line and
``gpuflow_agent_orphans_stopped_total``). It runs at start-up, before the agent serves (so
nothing is adopted that should not be), and then every ``Timings.orphan_check_s`` while it
serves: an instance re-placed while this host was cut off leaves no second copy behind, even
when the agent itself never restarts.

The verdict per process comes from its instance's workflow (``instance/<name>``; a helper's key
``instance@part`` belongs to its instance):

| the workflow | its placement | verdict |
| --- | --- | --- |
| running | names this host (main or subordinate) | keep: its workflow adopts or supervises it |
| running | names other hosts, or none (released, PENDING) | stop: ``elsewhere`` |
| closed, or not found | | stop: ``gone`` |
| the server or the query does not answer | | keep: not knowing is not gone |

One visibility query per check first lists the running instance workflows whose main worker
(the ``GpuflowWorker`` search attribute, set when a placement is booked) is this host: their
processes are kept without asking each workflow. Only the others (a helper on a subordinate host,
an instance that visibility does not show yet, an orphan) are described and queried. Asking
every workflow had cost a describe and a query (a replay of its history, where the control plane
no longer caches it) per process per ``orphan_check_s``: 50 calls/s at 1,500 replicas. A
placement moved away in the last moments may still be listed here: its process is then judged by
the next check.
"""

from __future__ import annotations

from dataclasses import dataclass

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from contracts.ids import INSTANCE_STATUS, instance_id
from contracts.search import SA_WORKER
from scheduler.naming import name_problem
from contracts.agent import instance_of
from worker_agent.processes import ProcessTable

KEEP, GONE, ELSEWHERE, UNKNOWN = "keep", "gone", "elsewhere", "unknown"


@dataclass(frozen=True)
class Orphan:
    key: str  # the process key: instance, or instance@part
    pid: int
    why: str  # gone | elsewhere
    detail: str


async def placement_verdict(client: Client, host: str, key: str) -> tuple[str, str]:
    """(verdict, detail) for the process ``key`` on ``host``, from its instance's workflow."""
    handle = client.get_workflow_handle(instance_id(instance_of(key)))
    try:
        desc = await handle.describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return GONE, "its instance's workflow does not exist"
        return UNKNOWN, f"cannot ask the server: {e}"
    status = desc.status.name if desc.status is not None else "UNKNOWN"
    if status != "RUNNING":
        return GONE, f"its instance's workflow ended ({status})"
    try:
        view = await handle.query(INSTANCE_STATUS)
    except Exception as e:  # noqa: BLE001  RPCError, a query timeout, WorkflowQueryFailedError: unknown
        return UNKNOWN, f"its workflow did not answer: {e}"
    hosts = [h for h in [view.get("worker"), *view.get("subordinate_workers", [])] if h]
    if host in hosts:
        return KEEP, ""
    return ELSEWHERE, f"its instance is placed on {', '.join(hosts)}" if hosts else \
        "its instance holds no placement (released; it is being placed again)"


async def placed_here(client: Client, host: str) -> set[str]:
    """The instances whose workflow runs with ``host`` as its main worker, by one visibility
    query; empty when it cannot be asked (then every process is judged by its workflow)."""
    if name_problem(host):  # quoted into the query below: the name rule leaves nothing to escape
        return set()
    q = (f"WorkflowType = 'ModelInstanceWorkflow' AND ExecutionStatus = 'Running' "
         f"AND {SA_WORKER.name} = '{host}'")
    try:
        return {w.id.removeprefix("instance/") async for w in client.list_workflows(q)}
    except RPCError:
        return set()


async def find_orphans(client: Client, host: str, table: ProcessTable) -> list[Orphan]:
    """The live processes of ``table`` that should not run here; records of dead ones are dropped."""
    out, records = [], []
    for rec in table.records():
        if table.alive(rec.pid):
            records.append(rec)
        else:
            table.forget(rec.instance)
    here = await placed_here(client, host) if records else set()
    for rec in records:
        if instance_of(rec.instance) in here:
            continue  # its workflow runs placed on this host: keep
        verdict, detail = await placement_verdict(client, host, rec.instance)
        if verdict in (GONE, ELSEWHERE):
            out.append(Orphan(rec.instance, rec.pid, verdict, detail))
    return out


async def stop_orphans(client: Client, host: str, table: ProcessTable, stop_grace_s: float = 10.0,
                       counter=None) -> list[Orphan]:
    """Stop every orphan (process group: SIGTERM, grace, SIGKILL), log it, count it by why."""
    stopped = []
    for o in await find_orphans(client, host, table):
        rec = table.find(o.key)
        if rec is None or rec.pid != o.pid:  # stopped or relaunched meanwhile: not the process judged
            continue
        await table.stop(o.key, stop_grace_s)
        print(f"gpuflow agent {host}: stopped orphan {o.key} (pid {o.pid}): {o.detail}", flush=True)
        if counter is not None:
            counter.labels(host, o.why).inc()
        stopped.append(o)
    return stopped
