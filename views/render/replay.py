"""Text for ``gpuflow explain --replay`` and ``--history`` (gpuflow/cli/explain.py)."""

from __future__ import annotations

from typing import Any

from views.render.explain import learned_line

WHAT = {"autoscale": "autoscaler step", "group": "group formation", "scale_out": "scale-out (placed alone)"}


def replay(r: dict[str, Any]) -> str:
    what = WHAT.get(r.get("kind"), "decision")
    head = f"{r['instance']}: {what} of {r['at']} (inputs {r['inputs'][:12]}, {r['saw']})"
    if r.get("learned"):  # it booked a learned claim: the recommender's state the inputs keep
        head += f"\nbooked {learned_line(r['learned'])}"
    if r["same"]:
        return f"{head}\nsame decision: {r['now']}"
    lines = [head, "different decision:", f"  recorded: {r['recorded']}", f"  now:      {r['now']}"]
    shown = r["differences"][:40]
    lines += [f"  {d}" for d in shown]
    if len(r["differences"]) > len(shown):
        lines.append(f"  ... and {len(r['differences']) - len(shown)} more")
    return "\n".join(lines)


def _outcome(r: dict[str, Any]) -> str:
    """A kept decision's outcome: an autoscaler step's direction; a group member's, formed with its
    group or placed alone."""
    kind = r.get("kind")
    if kind == "autoscale":
        return f"scale {r['outcome']}"
    return f"{r['outcome']} ({'group' if kind == 'group' else 'alone'})" if kind in ("group", "scale_out") else r["outcome"]


def history(deployment: str, rows: list[dict[str, Any]]) -> str:
    if not rows:
        return f"no decisions kept for {deployment}"
    lines = [f"{'WHEN':<26} {'REPLICA':<24} {'OUTCOME':<14} {'INPUTS':<12} WHERE / WHY"]
    for r in rows:
        who = "(autoscaler)" if r.get("kind") == "autoscale" else r["instance"][:24]
        outcome = _outcome(r)
        lines.append(f"{r['at'][:26]:<26} {who:<24} {outcome:<14} {r['inputs'][:12]:<12} {r['reason'][:120]}")
    lines.append(f"replay one: gpuflow explain REPLICA --replay --decision INPUTS (an autoscaler step: "
                 f"gpuflow explain {deployment} --replay --decision INPUTS)")
    return "\n".join(lines)
