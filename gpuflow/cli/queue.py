"""``gpuflow queue [--json]``: the PENDING queue as the control plane's next wake sees it: each
replica's position, tenant, priorities, deployment, how long it has waited and why (quota, does
not fit, held back for X, StrictFIFO behind X). The control plane judges the queue on a fresh
snapshot, with the requests its decisions costed, and records the reasons as a wake does
(activities/cluster_reads.py queue_page): what status, explain and the console then show, the
same text (activities/pending_reasons.py). Offline (--data-dir/--database-url) the queue is read
in order with the reasons the store holds (views/tenancy.py, which the web console reads too)."""

from __future__ import annotations

import json

from gpuflow.cli.connection import offline, offline_flags, open_offline_store, run_command, settings_from, temporal_flags


def _age(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def text(lines: list[dict], queueing: str) -> str:
    if not lines:
        return f"the queue is empty (queueing: {queueing})"
    out = [f"{'POS':>4}  {'INSTANCE':<24}{'TENANT':<12}{'TPRIO':>6}{'PRIO':>6}  {'DEPLOYMENT':<20}{'WAITING':>9}  REASON"]
    for x in lines:
        out.append(f"{x['position']:>4}  {x['instance']:<24}{x['tenant']:<12}{x['tenant_priority']:>6}{x['priority']:>6}  "
                   f"{x['deployment']:<20}{_age(x['waiting_s']):>9}  {x['reason']}")
    out.append(f"queueing: {queueing}; order: tenant priority, deployment priority, arrival")
    return "\n".join(out)


def _offline(a) -> tuple[str, list[dict]]:
    from gpuflow.settings import Settings
    from views.tenancy import queue

    return queue(open_offline_store(a), Settings().scheduler)


def _show(queueing: str, lines: list[dict], as_json: bool) -> None:
    print(json.dumps({"queueing": queueing, "queue": lines}, indent=2) if as_json else text(lines, queueing))


def cmd_queue(a) -> int:
    if offline(a):
        _show(*_offline(a), a.json)
        return 0
    from gpuflow import cluster_client as cl
    from gpuflow.runtime import connect

    s = settings_from(a)

    async def go():
        _show(*await cl.queue(await connect(s.temporal)), a.json)

    return run_command(go())


def add_commands(sub) -> None:
    p = sub.add_parser("queue", help="the PENDING queue: each replica's position, tenant, priority and why it waits")
    temporal_flags(p)
    offline_flags(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_queue, temporal=True)
