"""The agent's orphan check: a process this agent's table knows of whose (instance, part) the
reservation ledger does not book on this host is stopped and reported (a log line and
``gpuflow_agent_orphans_stopped_total``, by why). It runs at start-up, before the agent serves (so
nothing is adopted that should not be), and then every ``Timings.orphan_check_s`` while it serves:
an instance re-placed while this host was cut off leaves no second copy behind, a part no booking
names (a helper of a booking that has none, a part a probe invented, a pid file written outside
any launch) runs no longer than one check, even when the agent itself never restarts.

The ledger is asked once per check (the reads workflow's ``bookings`` query, or the host workflow's
``bookings`` update when that query gets no answer, worker_agent/bookings.py: the parts each
instance may run here, contracts/booked_parts.py); a process's instance workflow
(``instance/<name>``) is asked only when its part is not booked:

| the ledger | the process | its instance's workflow | verdict |
| --- | --- | --- | --- |
| books its part here | | | keep |
| does not | never seen booked by this agent run | | stop: ``unbooked`` |
| does not | seen booked before | closed or not found | stop: ``gone`` |
| does not | seen booked before | placed on other hosts, or none | stop: ``elsewhere`` |
| does not | seen booked before | says it is placed here, or does not answer | keep for ``wind_down_s`` after it was last seen booked, then stop: ``unbooked`` |
| cannot be asked | | as the three rows above | as they say; else keep (not knowing is not gone) |

The wind-down is a preempted victim's: the ledger moves its GPUs to the preemptor at once, while
its processes drain (``drain_timeout_s``) before its workflow stops them. A workflow can only make a
process stop sooner: anybody can start a workflow that says anything, but none keeps a process
that no booking names past the wind-down.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from contracts.ids import INSTANCE_STATUS, instance_id
from contracts.search import SA_WORKER
from scheduler.naming import name_problem
from contracts.agent import instance_of
from worker_agent.bookings import BookingUnknown, Bookings, LedgerBookings, part_of
from worker_agent.processes import ProcessTable, Record

KEEP, GONE, ELSEWHERE, UNKNOWN, UNBOOKED = "keep", "gone", "elsewhere", "unknown", "unbooked"
# How long a process whose booking here went away may go on while its workflow says it still runs
# here: a preempted victim drains (drain_timeout_s, 30 s by default), then its workflow stops it.
WIND_DOWN_S = 90.0


@dataclass(frozen=True)
class Orphan:
    key: str  # the process key: instance, or instance@part
    pid: int
    why: str  # unbooked | gone | elsewhere
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


async def find_orphans(client: Client, host: str, table: ProcessTable, bookings: Bookings | None = None,
                       wind_down_s: float = WIND_DOWN_S) -> list[Orphan]:
    """The live processes of ``table`` that should not run here; records of dead ones are dropped.
    ``bookings``: the ledger's reads (default: the host workflow's)."""
    records = []
    for rec in table.records():
        if table.alive(rec.pid):
            records.append(rec)
        else:
            table.forget(rec.instance)
    if not records:
        return []
    try:
        booked = await (bookings or LedgerBookings(client, host)).booked_here(
            sorted({instance_of(r.instance) for r in records}))
    except BookingUnknown:
        return await by_workflows(client, host, records)
    out, now = [], time.monotonic()
    for rec in records:
        b = booked.get(instance_of(rec.instance))
        if b is not None and b.part(part_of(rec.instance)) is not None:
            table.seen_booked(rec.instance)
            continue
        o = await unbooked(client, host, table, rec, now, wind_down_s)
        if o is not None:
            out.append(o)
    return out


def unbooked_verdict(last_booked: float | None, now: float, wind_down_s: float, workflow: str | None) -> str:
    """What becomes of a live process whose part the ledger does not book here (the module's table):
    ``last_booked``: when this agent run last saw it booked (None: never); ``workflow``: its
    instance workflow's verdict (KEEP, GONE, ELSEWHERE or UNKNOWN), asked only when it was seen
    booked. KEEP, or why it is stopped."""
    if last_booked is None:
        return UNBOOKED
    if workflow in (GONE, ELSEWHERE):
        return workflow
    return UNBOOKED if now - last_booked >= wind_down_s else KEEP


async def unbooked(client: Client, host: str, table: ProcessTable, rec: Record, now: float,
                   wind_down_s: float) -> Orphan | None:
    """The orphan that a live process whose part the ledger does not book here is, or None (kept)."""
    last = table.booked_at.get(rec.instance)
    verdict, detail = await placement_verdict(client, host, rec.instance) if last is not None else (None, "")
    why = unbooked_verdict(last, now, wind_down_s, verdict)
    if why == KEEP:
        return None
    if why == UNBOOKED:
        detail = (f"no booking in the ledger names part {part_of(rec.instance)!r} of instance "
                  f"{instance_of(rec.instance)} on this host") + (
            "" if last is None else f" since over {wind_down_s:g} s (its workflow still says it runs here)")
    return Orphan(rec.instance, rec.pid, why, detail)


async def by_workflows(client: Client, host: str, records: list[Record]) -> list[Orphan]:
    """The control plane's ledger cannot be asked: each process judged by its instance's workflow
    alone (closed, not found, or placed elsewhere: stopped; else kept)."""
    out = []
    here = await placed_here(client, host)
    for rec in records:
        if instance_of(rec.instance) in here:
            continue  # its workflow runs placed on this host: keep
        verdict, detail = await placement_verdict(client, host, rec.instance)
        if verdict in (GONE, ELSEWHERE):
            out.append(Orphan(rec.instance, rec.pid, verdict, detail))
    return out


async def stop_orphans(client: Client, host: str, table: ProcessTable, stop_grace_s: float = 10.0,
                       counter=None, bookings: Bookings | None = None, wind_down_s: float = WIND_DOWN_S) -> list[Orphan]:
    """Stop every orphan (process group: SIGTERM, grace, SIGKILL), log it, count it by why."""
    stopped = []
    for o in await find_orphans(client, host, table, bookings, wind_down_s):
        rec = table.find(o.key)
        if rec is None or rec.pid != o.pid:  # stopped or relaunched meanwhile: not the process judged
            continue
        await table.stop(o.key, stop_grace_s)
        print(f"gpuflow agent {host}: stopped orphan {o.key} (pid {o.pid}): {o.detail}", flush=True)
        if counter is not None:
            counter.labels(host, o.why).inc()
        stopped.append(o)
    return stopped
