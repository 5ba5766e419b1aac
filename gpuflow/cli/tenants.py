"""``gpuflow tenants apply FILE`` (the tenants file, validated and kept by the control plane) and
``gpuflow tenants [--json]``: each tenant's use against its guarantee and limit
(scheduler/tenancy/config.py). Both go through the cluster workflow at --address
(gpuflow/cluster_client.py); --data-dir/--database-url work on the store itself, offline."""

from __future__ import annotations

import json

from gpuflow import files
from gpuflow.cli.connection import offline, offline_flags, open_offline_store, run_command, settings_from, temporal_flags
from scheduler.tenancy.config import TenantsFile
from scheduler.units import GiB


def _amount(r: str, v: int | None) -> str:
    if v is None:
        return "-"
    return str(v) if r == "gpus" else f"{v / GiB:.1f} GiB"


def text(lines: list[dict], queueing: str) -> str:
    head = f"{'TENANT':<16}{'PRIO':>6}  {'GPUS used/guar/limit':<22}{'VRAM used/guar/limit':<34}{'PENDING':>8}  NOTE"
    out = [head]
    for x in lines:
        cols = [" / ".join(_amount(r, x[r][k]) for k in ("used", "guarantee", "limit")) for r in ("gpus", "vram")]
        note = "; ".join(filter(None, ["borrowing" if x["borrowing"] else "",
                                        f"cohort {x['cohort']}" if x.get("cohort") else "",
                                        "flavors " + ", ".join(x["flavors"]) if x.get("flavors") else ""]))
        out.append(f"{x['tenant']:<16}{x['priority']:>6}  {cols[0]:<22}{cols[1]:<34}{x['pending']:>8}  {note}".rstrip())
    out.append(f"queueing: {queueing}")
    return "\n".join(out)


def applied(done) -> str:
    names = ", ".join(done.tenants) + (f", and {done.count - len(done.tenants):,} more" if done.count > len(done.tenants) else "")
    return (f"tenants file applied (version {done.version}): {names or 'no tenants'}; queueing {done.queueing}"
            + (f"; {done.reasons} waiting replica(s) given the new reason" if done.reasons else ""))


def _offline(a, tf: TenantsFile | None) -> int:
    from activities import cluster_reads as r
    from views import tenancy as tenancy_view
    from gpuflow.settings import Settings

    engine = open_offline_store(a)
    if tf is not None:  # a spec that states its resources is costed here; others keep their reason
        print(applied(r.apply_tenants(engine, tf, tenancy_view.stated, Settings().scheduler)))
        return 0
    _show(*tenancy_view.tenants(engine), a.json)
    return 0


def _show(queueing: str, rows: list[dict], as_json: bool) -> None:
    print(json.dumps({"queueing": queueing, "tenants": rows}, indent=2) if as_json else text(rows, queueing))


def cmd_tenants(a) -> int:
    tf = files.load(a.file, TenantsFile) if getattr(a, "tenants_command", None) == "apply" else None
    if offline(a):
        return _offline(a, tf)
    from gpuflow import cluster_client as cl
    from gpuflow.runtime import connect

    s = settings_from(a)

    async def go():
        client = await connect(s.temporal)
        if tf is not None:
            print(applied(await cl.apply_tenants(client, tf)))
        else:
            _show(*await cl.tenants(client), a.json)

    return run_command(go())


def add_commands(sub) -> None:
    p = sub.add_parser("tenants", help="tenants: GPU guarantees and limits (apply FILE), and each one's use")
    temporal_flags(p)
    offline_flags(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_tenants, temporal=True)
    ts = p.add_subparsers(dest="tenants_command")
    ap = ts.add_parser("apply", help="apply a tenants file (YAML or JSON); replaces the one applied before")
    ap.add_argument("file")
    temporal_flags(ap)
    offline_flags(ap)
    ap.set_defaults(fn=cmd_tenants, temporal=True)
