"""``gpuflow rollout status NAME`` (a rollout's progress, old and new replicas, each step with its
reason and whether it fell back to stop-first, a group's way (role by role or whole, and why: scheduler/groups/compat.py), the versions kept with how each ended, and where
undo would go) and ``gpuflow rollout undo NAME`` (back to the last good spec before the current
one, never one rolled back for failing, rolled the same way; refused, with the reason, when there
is none). The rollout itself: workflows/rollout_steps.py."""

from __future__ import annotations

import argparse
import json

from gpuflow.cli.connection import run_command, settings_from, temporal_flags
from gpuflow.runtime import connect
from gpuflow.workflow_views import rollout_view


def render(v: dict) -> str:
    lines = [f"deployment {v['name']}: {v['status']}",
             f"  version {v['version']} (from {v['from_version']}); {v['desired']} replica(s) wanted; "
             f"new {len(v['new'])}, old {len(v['old'])}, stopping {len(v['stopping'])}"]
    if v.get("baking"):  # the last step taken: the version on probation (scheduler/rollout_bake.py)
        lines.append(f"  bake: {v.get('bake_left_s', 0):.0f} s left; judged: {v.get('bake_judged') or '-'}")
    if v.get("way"):  # a prefill/decode group's: which way its last edit rolls, and why (generation N)
        lines.append(f"  group generation {v.get('gen', 0)}: {v.get('why') or v['way']}")
    if v["new"] or v["old"]:
        lines.append(f"  new: {', '.join(v['new']) or '-'}   old: {', '.join(v['old']) or '-'}")
    if v["steps"]:
        lines.append("  steps:")
    for s in v["steps"]:
        what = s["action"] + (" (stop-first fallback)" if s["fallback"] else "")
        names = f" {', '.join(s['names'])}" if s["names"] else ""
        lines.append(f"    {s['at']}  v{s['version']}  {what}{names}: {s['reason']}")
    if v.get("history"):
        lines.append("  versions:")
    for h in v.get("history", []):
        result = f"{h['result']}: {h['reason']}" if h["reason"] else h["result"]
        notes = [n for n in (f"undo to version {h['undo_of']}'s spec" if h["undo_of"] is not None else "",
                             "current" if h["version"] == v["version"] else "") if n]
        lines.append(f"    v{h['version']}  {h['at'] or '-'}  {result}" + (f"  ({', '.join(notes)})" if notes else ""))
    if "undo" in v:
        u = v["undo"]
        lines.append(f"  undo would go to {u['says']}" if u["to"] is not None else f"  undo: nothing to undo to: {u['says']}")
    return "\n".join(lines)


def cmd_rollout(a) -> int:
    s = settings_from(a)

    async def go():
        client = await connect(s.temporal)
        if a.action == "undo":
            from contracts.ids import DEPLOYMENT_ROLLOUT_UNDO
            from gpuflow import ops

            h = await ops.deployment_handle(client, a.name)
            await ops.run_update(h, DEPLOYMENT_ROLLOUT_UNDO)  # refused: the reason, exit 1 (the view is not read)
        v = await rollout_view(client, a.name)
        undid = [s for s in v["steps"] if s["action"] == "undo"][-1:] if a.action == "undo" else []
        if undid and not a.json:
            print(f"undo {undid[0]['reason']}")
        print(json.dumps(v, indent=2) if a.json else render(v))

    return run_command(go())


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rollout", help="a deployment's rolling upgrade: status (with the versions kept), or undo: back to the "
                                         "last good spec before the current one")
    p.add_argument("action", choices=["status", "undo"])
    p.add_argument("name")
    p.add_argument("--json", action="store_true")
    temporal_flags(p)
    p.set_defaults(fn=cmd_rollout, temporal=True)
