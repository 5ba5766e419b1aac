"""Human-readable dry runs of a prefill/decode group: its formation (every member, the domain it
gathered into, degradations, or the role that does not fit and why) and scale-in's choice."""

from __future__ import annotations

from views.render.dryrun import decision, text_table


def formation(g, summaries: dict[str, str], layer_names: dict[str, str] | None = None) -> str:
    """``g``: a GroupDecision (scheduler/groups/decision.py); ``summaries``: each role's request in
    words; ``layer_names``: layer id -> its name (rack, zone, the cluster's own)."""
    out = [f"request, {role}: {s}" for role, s in summaries.items()]
    if g.scheduled:
        layer = (layer_names or {}).get(g.domain[0], g.domain[0]) if g.domain else ""
        where = f"{layer} {' / '.join(g.path) or g.domain[1]}" if g.domain else "the cluster"
        out.append(f"GROUP SCHEDULED: {len(g.members)} members, gathered in {where}")
        rows = [[m.role.value, str(m.ordinal), m.worker, ",".join(map(str, m.gpu_indexes)) or "-",
                 m.decision.strategy or "-"] for m in g.members]
        out += ["", text_table(rows, ["role", "#", "worker", "gpus", "strategy"])]
    else:
        out.append(f"GROUP UNSCHEDULABLE: {g.role.value if g.role else 'a role'} does not fit; nothing is booked")
    if g.degradations:
        out += ["", "degraded: " + ", ".join(g.degradations)]
    if g.reasons:
        out += ["", "reasons:"] + [f"  {r}" for r in g.reasons]
    if not g.scheduled and g.blocked is not None:
        out += ["", f"where {g.role.value if g.role else 'it'} came closest:", decision(g.blocked, "-")]
    return "\n".join(out)


def scale_in(choice, role: str) -> str:
    """``choice``: a ScaleInChoice (scheduler/groups/scale_in.py), removal order first."""
    head = f"scale-in of {role} removes {choice.victim}" if choice.victim else f"no {role} member to remove"
    rows = [[m.instance.name, m.instance.worker or "-", f"{m.score:.2f}",
             " ".join(f"{k}={v:.1f}" for k, v in m.scores.items()), m.why] for m in choice.members]
    out = [head]
    if rows:
        out += ["", text_table(rows, ["member", "worker", "score", "scores", "why"])]
    return "\n".join(out + [""] + [f"  {r}" for r in choice.reasons])
