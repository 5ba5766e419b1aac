"""``gpuflow queue [--json]``: the PENDING queue as the control plane's next wake sees it, read
from the store: each replica's position, tenant, priorities, deployment, how long it has waited
and why (quota, does not fit, held back for X, StrictFIFO behind X). The verdicts are the wake's
own (activities/wake_queue.py), computed here on a fresh snapshot. A spec that states its
resources is costed here; one costed from model files shows the instance's own last reason."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from gpuflow.cli.gateway import _store, _store_flags


def rows(verdict, now: datetime) -> list[dict]:
    from activities.wake_queue import current

    out = []
    for pos, r in enumerate(verdict.order, 1):
        why = current(r.reason, verdict.reason(r.instance))  # what the wake records (wake_queue.current)
        if r.instance in verdict.unknown:
            why = f"request not costed here; its last decision: {r.reason or 'none yet'}"
        elif r.instance in verdict.wake.woken:
            why = "fits now: the next wake places it"
        out.append({"position": pos, "instance": r.instance, "tenant": r.tenant, "tenant_priority": r.tenant_priority,
                    "priority": r.priority, "deployment": r.deployment, "queued_at": r.queued_at.isoformat(),
                    "waiting_s": round(max(0.0, (now - r.queued_at).total_seconds()), 1), "reason": why})
    return out


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


def cmd_queue(a) -> int:
    from store.snapshot import load_snapshot
    from activities.wake_queue import judge, read
    from gpuflow.settings import Settings
    from scheduler.estimate import estimate_request, states_resources

    engine = _store(a)

    def stated(spec):  # resources stated: nothing to read; otherwise unknown here
        return estimate_request(spec) if states_resources(spec) else None

    q = read(engine)
    v = judge(q, load_snapshot(engine), stated, Settings().scheduler)
    lines = rows(v, datetime.now(timezone.utc))
    print(json.dumps({"queueing": q.tenants.queueing, "queue": lines}, indent=2) if a.json
          else text(lines, q.tenants.queueing))
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("queue", help="the PENDING queue: each replica's position, tenant, priority and why it waits")
    _store_flags(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_queue)
