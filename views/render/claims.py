"""``gpuflow claims`` in words (views/claims.py gives the rows): a block per fingerprint."""

from __future__ import annotations

from typing import Any

from scheduler.claims.words import duration, size


def _deployments(r: dict[str, Any]) -> str:
    names = ", ".join(f"{d['name']} ({d['mode']})" for d in r["deployments"]) or "none now"
    return f"deployments {names}; {r['replicas']} replica{'s' if r['replicas'] != 1 else ''} measured now"


def advice(r: dict[str, Any]) -> str:
    """What the learned claim changes, in the deployments' modes."""
    if not r["confident"] or r["learned"] is None:
        return "no change: the estimate is booked until the learned claim is confident"
    if r["change"] is None:
        return f"would book {size(r['learned'])} a replica (no replica measured now)"
    modes = {d["mode"] for d in r["deployments"]}
    verb = "books" if modes == {"apply"} else "would book" if modes <= {"advise"} else "books (apply) / would book (advise)"
    diff = r["change"]
    how = "the same" if abs(diff) < 2**20 else f"{size(abs(diff))} {'less' if diff < 0 else 'more'}"
    out = f"{verb} {size(r['learned'])} a replica instead of {size(r['booked'])} ({how})"
    if r["frees"]:
        out += f", freeing {size(r['frees'])} over {r['replicas']} replica{'s' if r['replicas'] != 1 else ''}"
    if "apply" in modes:
        out += "; at each replica's next placement (never in place)"
    return out


def block(r: dict[str, Any]) -> list[str]:
    est = size(r["estimate"]) if r["estimate"] else "not told"
    learned = size(r["learned"]) if r["learned"] is not None else "-"
    state = "confident" if r["confident"] else "learning"
    return [r["label"],
            f"  {_deployments(r)}",
            f"  estimate {est}, booked {size(r['booked'])}, peak {size(r['peak'])}; learned {learned} "
            f"({state}, confidence {r['confidence']:.2f})",
            f"  {r['reason']}",
            f"  {advice(r)}"]


def text(view: dict[str, Any]) -> str:
    s = view["settings"]
    head = (f"claims mode {view['mode']}: p{s['percentile'] * 100:g} + {s['margin'] * 100:g}%, half-life "
            f"{duration(s['half_life_s'])}, confident from {s['min_samples']:,} samples over "
            f"{duration(s['min_history_s'])}")
    if not view["claims"]:
        return head + "\nno fingerprint measured yet (replicas report their memory with their host's usage)"
    out = [head]
    for r in view["claims"]:
        out += [""] + block(r)
    return "\n".join(out)
