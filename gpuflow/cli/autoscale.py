"""``gpuflow autoscale NAME [--json]``: an autoscaled deployment's last decisions (the
``autoscale`` query of its ``autoscaler/NAME`` workflow), and the one-line summaries
``gpuflow status`` shows."""

from __future__ import annotations

import json
import time
from typing import Any

from temporalio.client import Client

from gpuflow.workflow_views import autoscale_view, autoscaler
from scheduler.errors import InvalidInput


def _ms(v) -> str:
    return "-" if v is None else f"{v * 1000:.0f}ms"


def line(name: str, v: dict[str, Any]) -> str:
    """One line for `gpuflow status`."""
    last = (v.get("history") or [{}])[-1]
    why = "; ".join(v.get("blocked_reasons") or [])[:200]
    blocked = f"; CAPACITY-BLOCKED: {why}" if v.get("capacity_blocked") else ""
    ended = f"; ended: {v['ended']}" if v.get("ended") else ""
    for key, what in (("request_to_first_token_s", "request to first token"),
                      ("decision_to_running_s", "0 -> 1 decision to RUNNING")):
        got = [c[key] for c in v.get("cold_starts") or [] if key in c]
        if got:
            ended += f"; last cold start {got[-1]:.1f} s ({what})"
    if v.get("roles"):  # a prefill/decode group: each role's own count, and why a blocked one is
        return f"autoscaler {name}: " + "; ".join(_role_line(r, v) for r in v["roles"]) + ended
    return (f"autoscaler {name}: desired {v.get('desired')}, last {last.get('direction', '-')} by "
            f"{last.get('rule', '-')} ({last.get('done', '-')}){blocked}{ended}")


def _role_line(r: dict[str, Any], v: dict[str, Any]) -> str:
    last = next((h for h in reversed(v.get("history") or []) if h.get("role") == r.get("role")), {})
    blocked = f", CAPACITY-BLOCKED: {'; '.join(r.get('blocked_reasons') or [])[:200]}" if r.get("capacity_blocked") else ""
    return (f"{r.get('role')} desired {r.get('desired')}, last {last.get('direction', '-')} by {last.get('rule', '-')} "
            f"({last.get('done', '-')}){blocked}")


# the figure each rule decides on, as a decision record's signals keep it (scheduler/autoscale/signals.py)
RULE_SIGNAL = {"ttft": ("ttft_p90_s", "TTFT p90"), "itl": ("itl_p90_s", "ITL p90"),
               "queue_time_p90": ("queue_time_p90_s", "queue time p90"), "kv_usage": ("kv_usage", "KV usage"),
               "concurrency": ("concurrency", "in flight")}


def rule_signal(rule: str | None, s: dict[str, Any]) -> str:
    """The rule's own figure where the table's columns (queue, TPOT, P95) do not show it: a group's
    prefill decides on TTFT, its decode on ITL; '' otherwise."""
    key, what = RULE_SIGNAL.get(rule or "", (None, ""))
    v = s.get(key) if key else None
    if v is None:
        return ""
    return f" [{what} {_ms(v) if key.endswith('_s') else f'{v:.2f}'}]"


def render(v: dict[str, Any]) -> str:
    out = [line(v["deployment"], v), f"{'when':>8}  {'dir':5} {'rule':15} {'repl':>9} {'queue':>6} {'TPOT':>7} "
           f"{'P95':>7}  done / why"]
    now = time.time()
    for h in v.get("history") or []:
        s = h.get("signals") or {}
        repl = f"{h.get('current', '-')}->{h.get('target', '-')}" if "target" in h else "-"
        dry = h.get("dry_run") or {}
        reasons = ("; " + "; ".join(dry["reasons"])[:160]) if dry.get("reasons") else ""
        fit = f" [dry run: {dry['fits']}/{dry['asked']} fit{reasons}]" if dry else ""
        rule = f"{h['role']}:{h.get('rule', '-')}" if h.get("role") else h.get("rule", "-")
        out.append(f"{now - h['at']:>7.0f}s  {h.get('direction', '-'):5} {rule:15} {repl:>9} "
                   f"{s.get('queue', 0):>6.1f} {_ms(s.get('tpot_s')):>7} {_ms(s.get('latency_p95_s')):>7}  "
                   f"{h.get('done', '-')}: {h.get('reason', '')}{rule_signal(h.get('rule'), s)}{fit}")
    return "\n".join(out)


def cmd_autoscale(a) -> int:
    from gpuflow.cli.connection import run_command, settings_from
    from gpuflow.runtime import connect

    s = settings_from(a)

    async def go():
        client = await connect(s.temporal)
        v = await autoscaler(client, a.name)  # failed or stuck: said at once, never queried
        if v is None:
            raise InvalidInput(f"deployment {a.name!r} has no autoscaler (its spec has no autoscaling block, "
                               f"or it does not exist)")
        if a.role:  # a group's one role: its records and its line only
            v = {**v, "history": [h for h in v.get("history") or [] if h.get("role") == a.role],
                 "roles": [r for r in v.get("roles") or [] if r.get("role") == a.role]}
        print(json.dumps(v, indent=2) if a.json else render(v))

    return run_command(go())


def add_commands(sub) -> None:
    from gpuflow.cli.connection import temporal_flags

    p = sub.add_parser("autoscale", help="an autoscaled deployment's last 50 decisions and why")
    temporal_flags(p)
    p.add_argument("name")
    p.add_argument("--json", action="store_true")
    p.add_argument("--role", choices=("prefill", "decode"), help="a prefill/decode group's one role: its decisions only")
    p.set_defaults(fn=cmd_autoscale, temporal=True)


async def add_status(client: Client, st: dict[str, Any]) -> str:
    """Add each autoscaled deployment's summary to ``gpuflow status``'s dict (``autoscaler``) and
    return its lines (empty when none is autoscaled)."""
    lines = []
    for d in st.get("deployments", []):
        if d.get("broken"):
            continue
        v = await autoscale_view(client, d["name"])
        if v is None:
            continue
        last = (v.get("history") or [{}])[-1]
        d["autoscaler"] = {"desired": v.get("desired"), "capacity_blocked": v.get("capacity_blocked"),
                           "roles": v.get("roles") or [],
                           "blocked_reasons": v.get("blocked_reasons"), "ended": v.get("ended"),
                           "last": {k: last.get(k) for k in ("at", "direction", "rule", "reason", "done")}}
        lines.append(line(d["name"], v))
    return "".join("\n" + ln for ln in lines)
