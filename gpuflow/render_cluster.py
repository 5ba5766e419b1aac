"""Plain-text views of the live cluster for the CLI."""

from __future__ import annotations

from typing import Any

from scheduler.units import gib


def _gpus(h: dict[str, Any]) -> str:
    r = h.get("report") or {}
    gs = r.get("gpus") or []
    if not gs:
        return "CPU only"
    return ", ".join(f"{g['index']}:{gib(g['vram_total'])}GiB"
                     + (f" ({gib(g['vram_foreign'])} GiB not ours)" if g.get("vram_foreign") else "") for g in gs)


def progress(d: dict[str, Any] | None) -> str:
    """'1.25 of 4.00 GiB (31%)' from a download's heartbeat."""
    if not d:
        return ""
    done, total = d.get("done", 0), d.get("total")
    if total:
        return f"{gib(done)} of {gib(total)} GiB ({100 * done // total}%)"
    return f"{gib(done)} GiB so far"


def hosts(hs: list[dict[str, Any]]) -> str:
    if not hs:
        return "no hosts"
    lines = [f"{'HOST':<16} {'STATE':<10} {'KIND':<10} GPUS"]
    for h in hs:
        kind = "simulated" if (h.get("report") or {}).get("simulated") else "real"
        lines.append(f"{h['name']:<16} {h['state'].upper():<10} {kind:<10} {_gpus(h)}"
                     + (f"  ({h['reason']})" if h.get("reason") else ""))
    return "\n".join(lines)


def status(st: dict[str, Any]) -> str:
    out = []
    for d in st["deployments"]:
        if d.get("broken"):
            out.append(f"deployment {d['name']}: BROKEN: {d['broken']}")
            continue
        out.append(f"deployment {d['name']} ({d.get('backend')}): {d['replicas']} replica(s) wanted"
                   + (", deleting" if d.get("deleting") else ""))
        out.append(f"  {'INSTANCE':<20} {'STATE':<12} {'WORKER':<12} {'GPUS':<8} REASON")
        for i in d["instances"]:
            gpus = ",".join(map(str, i.get("gpu_indexes") or [])) or "-"
            worker = "+".join([i.get("worker") or "-", *i.get("subordinate_workers", [])])
            reason = i.get("reason") or ""
            if i.get("download"):
                reason = f"{reason}: {progress(i['download'])}"
            out.append(f"  {i['name']:<20} {i['state'].upper():<12} {worker:<12} {gpus:<8} {reason}")
    if not st["deployments"]:
        out.append("no deployments")
    if st.get("hosts"):
        out.append("")
        out.append(hosts(st["hosts"]))
    return "\n".join(out)


def explain(d: dict[str, Any]) -> str:
    if d.get("decision") is None:
        return f"instance {d['instance']}: {d['state']} (no decision recorded yet) {d.get('reason', '')}"
    lines = [f"instance {d['instance']}: {d['state'].upper()} on {d.get('worker') or '-'} GPUs {d.get('gpu_indexes')}"]
    lines.append(f"request: {d.get('request')}")
    lines.append(f"scheduled: {d['scheduled']} by {d.get('strategy')} with score {d.get('score')}")
    dec = d["decision"]
    for f in dec.get("filters", []):
        lines.append(f"  filter {f['filter']}: {f['before']} -> {f['kept']}")
        for r in f.get("removed", []):
            lines.append(f"    - {r['worker']}: {'; '.join(r['reasons'])}")
    lines.append(f"  candidates (top {len(dec.get('candidates', []))} of {dec.get('candidates_total')}):")
    for c in dec.get("candidates", []):
        lines.append(f"    {c['worker']} GPUs {c['gpu_indexes']}: score {c.get('score')} {c.get('scores')}")
    for r in d.get("reasons", []):
        lines.append(f"  reason: {r}")
    return "\n".join(lines)
