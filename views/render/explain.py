"""``gpuflow explain INSTANCE`` in words: the request in GiB, the placement with its strategy and
scores, or, for a replica not placed, the decisive reasons first (scheduler/reasons.py); then the
memory its hosts measured against its claim (render/usage.py); then each filter's verdict and the
best candidates. ``--json`` gives the recorded decision whole."""

from __future__ import annotations

from typing import Any

from views.render import usage
from views.render.dryrun import text_table
from scheduler import foreign
from scheduler.summary import summary_text
from scheduler.units import gib


def request_text(r: dict[str, Any] | None) -> str:
    try:
        return summary_text(r) if r else "-"
    except (KeyError, TypeError):  # a record written by another version: show it as it is
        return str(r)


def _where(worker: str | None, gpus: list[int] | None, subs: list[dict]) -> str:
    gpu = f"GPUs {','.join(map(str, gpus))}" if gpus else "CPU only"
    return f"{worker or '-'} {gpu}" + "".join(f" + {s['worker']} GPUs {','.join(map(str, s.get('gpu_indexes', [])))}"
                                              for s in subs)


def _scores(c: dict[str, Any]) -> str:
    parts = ", ".join(f"{k} {v:.2f}" for k, v in (c.get("scores") or {}).items())
    return f"{c.get('score', 0):.2f}" + (f" ({parts})" if parts else "")


def _candidates(dec: dict[str, Any], placed: dict[str, Any] | None) -> list[str]:
    cands = dec.get("candidates") or []
    if not cands:
        return []
    names = list(cands[0].get("scores") or {})
    rows = []
    for c in cands:
        claim = c.get("claim") or {}
        vram = ", ".join(f"{i}:{gib(b)}" for i, b in (claim.get("vram") or {}).items()) or "-"
        same = placed is not None and (c["worker"], c["gpu_indexes"]) == (placed.get("worker"), placed.get("gpu_indexes"))
        rows.append(["*" if same else "", _where(c["worker"], c["gpu_indexes"], c.get("subordinates") or []), vram,
                     gib(claim.get("ram", 0)), *[f"{c['scores'].get(n, 0):.2f}" for n in names], f"{c.get('score', 0):.2f}"])
    head = f"candidates (top {len(cands)} of {dec.get('candidates_total', len(cands))}):"
    table = text_table(rows, ["", "where", "vram GiB", "ram GiB", *names, "score"])
    return ["", head] + ["  " + ln for ln in table.splitlines()]


def _filters(dec: dict[str, Any]) -> list[str]:
    out = []
    for f in dec.get("filters") or []:
        note = f" ({f['note']})" if f.get("note") else ""
        out.append(f"  {f['filter']}: kept {f['kept']} of {f['before']}{note}")
        out.extend(f"    - {r['worker']}: {'; '.join(r['reasons'])}" for r in f.get("removed") or [])
    return ["", "filters:"] + out if out else []


def explain(d: dict[str, Any]) -> str:
    state = str(d.get("state", "?")).upper()
    now = [f"waiting now: {d['now']}"] if d.get("now") else []  # the queue's current word (gpuflow status, queue)
    if d.get("decision") is None:
        return "\n".join([f"instance {d['instance']}: {state} (no decision recorded yet) {d.get('reason') or ''}".rstrip()]
                         + now)
    dec = d["decision"]
    lines = [f"instance {d['instance']}: {state}"] + now + [f"request: {request_text(d.get('request'))}"]
    if d.get("scheduled"):
        placed = dec.get("placement") or {}
        where = _where(d.get("worker") or placed.get("worker"), d.get("gpu_indexes") or placed.get("gpu_indexes"),
                       placed.get("subordinates") or [])
        chosen = _chosen(dec, placed) or {"score": d.get("score") or 0}
        lines.append(f"placed on {where} by strategy {d.get('strategy')}, score {_scores(chosen)}"
                     + (f", link {placed['link']}" if placed.get("link") else "")
                     + (f", pinned to CPUs {placed['cpus']}" if placed.get("cpus") else ""))
        lines.extend(f"  {r}" for r in d.get("reasons") or dec.get("reasons") or [] if str(r).startswith(foreign.PREFIX))
        if dec.get("victims"):  # placed by preemption (scheduler/tenancy/preemption.py)
            lines.append(f"preempted {', '.join(dec['victims'])} {dec.get('preempt_why') or ''}".rstrip())
    else:  # every other reason is a filter's, shown with its filter below
        placed, reasons = None, list(d.get("reasons") or dec.get("reasons") or [])
        lines.append(f"not placed, because (decided on {d.get('workers_seen', '?')} worker(s)):")
        lines.extend(f"  - {r}" for r in reasons[:dec.get("decisive") or len(reasons)])
    return "\n".join(lines + group_lines(d.get("group")) + usage.lines(d.get("vram")) + _filters(dec)
                     + _candidates(dec, placed))


def group_lines(g: dict[str, Any] | None) -> list[str]:
    """A prefill/decode group member's group decision (contracts/decision.py GroupNote): formed with
    its group (the domain, every member's role, host and GPUs, the degradations) or placed alone
    after it; not formed, why, naming the role that does not fit."""
    if not g:
        return []
    if g["kind"] == "scale_out":
        head = f"{g['role']} of group {g['group']}: placed alone after formation (scale_out)"
    elif g["scheduled"]:
        where = f"{g['domain']} ({g['layer']})" if g.get("domain") else "the cluster"
        head = f"{g['role']} of group {g['group']}: the group formed whole, gathered in {where}"
    else:
        head = f"{g['role']} of group {g['group']}: the group did not form" + \
            (f": {g['blocked']} does not fit" if g.get("blocked") else "")
    out = ["", head]
    out += [f"  {m['role']:<8} {m['name']:<24} {_where(m.get('worker'), m.get('gpu_indexes'), [])}"
            for m in g.get("members") or []]
    if g.get("degradations"):
        out.append(f"  degraded: {', '.join(g['degradations'])}")
    if g["scheduled"]:  # not placed: the record's reasons above are the group's
        out += [f"  - {r}" for r in (g.get("reasons") or [])[:12]]
    return out


def _chosen(dec: dict[str, Any], placed: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in dec.get("candidates") or []
                 if (c["worker"], c["gpu_indexes"]) == (placed.get("worker"), placed.get("gpu_indexes"))), None)


def learned_line(kept: dict[str, Any] | None) -> str:
    """A booked learned claim (issue 42), from the state a decision keeps (scheduler/learned_claim.py):
    'claim 10.4 GiB learned from 1,240 samples over 3 days (p90 9.0 GiB + 15%); the estimate was
    14.0 GiB', and how sure the recommender was; '' when the decision booked none, or a record
    from another version that does not read."""
    from scheduler.claim_apply import learned_text
    from scheduler.errors import InvalidInput
    from scheduler.learned_claim import LearnedClaim

    if not kept:
        return ""
    try:
        c = LearnedClaim.from_dict(kept)
    except InvalidInput:
        return ""
    sure = f" (confidence {c.confidence:.2f}; fingerprint {c.fingerprint[:12]})" if c.fingerprint else ""
    return learned_text(c) + sure
