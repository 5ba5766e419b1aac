"""``gpuflow tenants apply FILE`` (the tenants file, kept in the store) and ``gpuflow tenants
[--json]``: each tenant's use against its guarantee and limit (scheduler/tenancy/config.py)."""

from __future__ import annotations

import json

from gpuflow import files
from gpuflow.cli.gateway import _store, _store_flags
from scheduler.tenancy.admission import borrowing
from scheduler.tenancy.config import RESOURCES, Tenant, TenantsFile
from scheduler.tenancy.usage import Usage
from scheduler.units import GiB


def _amount(r: str, v: int | None) -> str:
    if v is None:
        return "-"
    return str(v) if r == "gpus" else f"{v / GiB:.1f} GiB"


def rows(tf: TenantsFile, used: dict[str, Usage], pending: dict[str, int]) -> list[dict]:
    """One line per tenant (the file's, then ``default``, then any holding capacity unnamed)."""
    names = [t.name for t in tf.tenants] + sorted(({"default"} | set(used) | set(pending)) - {t.name for t in tf.tenants})
    out = []
    for n in names:
        t: Tenant = tf.get(n) or Tenant(name=n)
        u = used.get(n, Usage())
        out.append({"tenant": n, "priority": t.priority, "borrowing": borrowing(t, u) and bool(t.guarantee.named()),
                    "pending": pending.get(n, 0),
                    "requests_per_s": t.requests_per_s, "max_concurrent": t.max_concurrent,
                    **{r: {"used": getattr(u, r), "guarantee": getattr(t.guarantee, r), "limit": getattr(t.limit, r)}
                       for r in RESOURCES}})
    return out


def text(lines: list[dict], queueing: str) -> str:
    head = f"{'TENANT':<16}{'PRIO':>6}  {'GPUS used/guar/limit':<22}{'VRAM used/guar/limit':<34}{'PENDING':>8}  NOTE"
    out = [head]
    for x in lines:
        cols = [" / ".join(_amount(r, x[r][k]) for k in ("used", "guarantee", "limit")) for r in ("gpus", "vram")]
        note = "borrowing" if x["borrowing"] else ""
        out.append(f"{x['tenant']:<16}{x['priority']:>6}  {cols[0]:<22}{cols[1]:<34}{x['pending']:>8}  {note}".rstrip())
    out.append(f"queueing: {queueing}")
    return "\n".join(out)


def _refresh_reasons(engine) -> int:
    """The PENDING replicas' reasons under the new file (activities/wake_queue.judge_and_record), for
    specs that state their resources (a spec costed from files keeps its own until its next wake)."""
    from store.snapshot import load_snapshot
    from activities.wake_queue import judge_and_record
    from gpuflow.settings import Settings
    from scheduler.estimate import estimate_request, states_resources

    return judge_and_record(engine, load_snapshot(engine),
                            lambda spec: estimate_request(spec) if states_resources(spec) else None,
                            Settings().scheduler)[1]


def cmd_tenants(a) -> int:
    from store import tenants

    engine = _store(a)
    if getattr(a, "tenants_command", None) == "apply":
        tf = files.load(a.file, TenantsFile)
        v = tenants.apply(engine, tf)
        moved = _refresh_reasons(engine)
        print(f"tenants file applied (version {v}): {', '.join(t.name for t in tf.tenants) or 'no tenants'}; "
              f"queueing {tf.queueing}" + (f"; {moved} waiting replica(s) given the new reason" if moved else ""))
        return 0
    tf = tenants.load(engine)
    lines = rows(tf, tenants.usage(engine), tenants.pending_by_tenant(engine))
    print(json.dumps({"queueing": tf.queueing, "tenants": lines}, indent=2) if a.json else text(lines, tf.queueing))
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("tenants", help="tenants: GPU guarantees and limits (apply FILE), and each one's use")
    _store_flags(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_tenants)
    ts = p.add_subparsers(dest="tenants_command")
    ap = ts.add_parser("apply", help="apply a tenants file (YAML or JSON); replaces the one applied before")
    ap.add_argument("file")
    _store_flags(ap)
    ap.set_defaults(fn=cmd_tenants)
