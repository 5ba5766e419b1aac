"""``gpuflow rollout status NAME`` (a rollout's progress, old and new replicas, each step with its
reason and whether it fell back to stop-first) and ``gpuflow rollout undo NAME`` (back to the
spec before the last change, rolled the same way). The rollout itself: workflows/rollout_steps.py."""

from __future__ import annotations

import argparse
import json

from gpuflow.cli.cluster import _run, settings_from, temporal_flags
from gpuflow.runtime import connect


async def rollout_view(client, name: str) -> dict:
    from gpuflow import ops

    h = await ops._deployment(client, name)
    return await h.query("rollout")


def render(v: dict) -> str:
    lines = [f"deployment {v['name']}: {v['status']}",
             f"  version {v['version']} (from {v['from_version']}); {v['desired']} replica(s) wanted; "
             f"new {len(v['new'])}, old {len(v['old'])}, stopping {len(v['stopping'])}"]
    if v["new"] or v["old"]:
        lines.append(f"  new: {', '.join(v['new']) or '-'}   old: {', '.join(v['old']) or '-'}")
    if v["steps"]:
        lines.append("  steps:")
    for s in v["steps"]:
        what = s["action"] + (" (stop-first fallback)" if s["fallback"] else "")
        names = f" {', '.join(s['names'])}" if s["names"] else ""
        lines.append(f"    {s['at']}  v{s['version']}  {what}{names}: {s['reason']}")
    return "\n".join(lines)


def cmd_rollout(a) -> int:
    s = settings_from(a)

    async def go():
        client = await connect(s.temporal)
        if a.action == "undo":
            from gpuflow import ops
            from workflows.deployment import ModelDeploymentWorkflow

            h = await ops._deployment(client, a.name)
            await ops._update(h, ModelDeploymentWorkflow.rollout_undo)
        v = await rollout_view(client, a.name)
        print(json.dumps(v, indent=2) if a.json else render(v))

    return _run(go())


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rollout", help="a deployment's rolling upgrade: status, or undo the last spec change")
    p.add_argument("action", choices=["status", "undo"])
    p.add_argument("name")
    p.add_argument("--json", action="store_true")
    temporal_flags(p)
    p.set_defaults(fn=cmd_rollout, temporal=True)
