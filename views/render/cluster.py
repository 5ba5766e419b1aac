"""Plain-text views of the live cluster for the CLI."""

from __future__ import annotations

from typing import Any

from contracts.host_kinds import HOST_KINDS, host_kind
from views.render import spec_text, usage
from scheduler import foreign
from scheduler.units import gib


def _gpus(h: dict[str, Any]) -> str:
    r = h.get("report") or {}
    gs = r.get("gpus") or []
    if not gs:
        return "CPU only"
    return ", ".join(f"{g['index']}:{gib(g['vram_total'])}GiB"
                     + (f" ({foreign.words(g['vram_foreign'])})" if g.get("vram_foreign") else "") for g in gs)


def foreign_degraded(report: dict[str, Any]) -> list[str]:
    """The host's cards where other processes' memory grew past the room its bookings leave
    (scheduler/foreign.py), in words; [] when none."""
    out = []
    for d in report.get("foreign_degraded") or []:
        try:
            out.append(foreign.Degraded(int(d["index"]), int(d["foreign"]), int(d["booked"]), int(d["room"])).text())
        except (KeyError, TypeError, ValueError):
            continue
    return out


def topology(gs: list[dict[str, Any]]) -> str:
    """'NUMA 0: GPUs 0,1 (CPUs 0-31); NVLink: 0-1' from the GPUs' topology fields; '' without any."""
    nodes: dict[int, list[dict[str, Any]]] = {}
    for g in gs:
        if g.get("numa_node") is not None:
            nodes.setdefault(g["numa_node"], []).append(g)
    parts = [f"NUMA {n}: GPUs {','.join(str(g['index']) for g in members)}"
             + (f" (CPUs {members[0]['cpus']})" if members[0].get("cpus") else "") for n, members in sorted(nodes.items())]
    pairs = sorted({tuple(sorted((g["index"], p))) for g in gs for p in g.get("nvlink_peers") or []})
    if pairs:
        parts.append("NVLink: " + " ".join(f"{a}-{b}" for a, b in pairs))
    return "; ".join(parts)


def progress(d: dict[str, Any] | None) -> str:
    """'1.25 of 4.00 GiB (31%)' from a download's heartbeat."""
    if not d:
        return ""
    done, total = d.get("done", 0), d.get("total")
    if total:
        return f"{gib(done)} of {gib(total)} GiB ({100 * done // total}%)"
    return f"{gib(done)} GiB so far"


def _serving(i: dict[str, Any]) -> str:
    """'10.0.0.5:8001  2': where the server listens and its requests in flight (- when unknown)."""
    addr = f"{i.get('address') or '-'}:{i['port']}" if i.get("port") else "-"
    return f"{addr:<21} {i.get('in_flight', '-')!s:<9}"


def hosts(hs: list[dict[str, Any]]) -> str:
    if not hs:
        return "no hosts"
    lines = [f"{'HOST':<16} {'STATE':<10} {'KIND':<10} GPUS"]
    for h in hs:
        report = h.get("report") or {}
        kind = host_kind(bool(report.get("simulated")), report.get("runs"))  # contracts/host_kinds.py HOST_KINDS
        cordon = ("  CORDONED" + (f" ({h['cordon_reason']})" if h.get("cordon_reason") else "")
                  if h.get("cordoned") else "")  # no new replicas there (gpuflow hosts uncordon)
        lines.append(f"{h['name']:<16} {h['state'].upper():<10} {kind:<10} {_gpus(h)}"
                     + (f"  ({h['reason']})" if h.get("reason") else "") + cordon)
        for line in foreign_degraded(report):  # an alert, never an eviction
            lines.append(f"{'':<16} DEGRADED: {line}")
        topo = topology((h.get("report") or {}).get("gpus") or [])
        if topo:
            lines.append(f"{'':<16} topology: {topo}")
        kv = report.get("kv_connectors")  # what its engines hand KV over with (prefill/decode groups)
        if kv is not None:
            lines.append(f"{'':<16} KV connectors: {', '.join(kv) or 'none'}")
        refused = h.get("refusal")  # the last report its workflow refused (a forgery, a second agent)
        if refused:
            lines.append(f"{'':<16} refused a {refused.get('purpose') or ''} report at {refused.get('at', '')[:19]}: "
                         f"{refused.get('why', '')[:200]}")
    kinds = sorted({host_kind(bool((h.get("report") or {}).get("simulated")), (h.get("report") or {}).get("runs"))
                    for h in hs} - {"real"})
    lines += [f"{k}: {HOST_KINDS[k]}" for k in kinds]  # what a kind other than real means
    return "\n".join(lines)


def counts(items: list[dict[str, Any]]) -> str:
    """'RUNNING 298, PENDING 2': how many are in each state, the most first (then by name)."""
    n: dict[str, int] = {}
    for i in items:
        n[i["state"].upper()] = n.get(i["state"].upper(), 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(n.items(), key=lambda kv: (-kv[1], kv[0]))) or "none"


def status(st: dict[str, Any], summary: bool = False) -> str:
    """Each deployment: its header, a line of counts by state, and (unless ``summary``) a row per
    instance; then the hosts (``summary``: their counts by state)."""
    out = []
    for d in st["deployments"]:
        if d.get("broken"):
            out.append(f"deployment {d['name']}: BROKEN: {d['broken']}")
            continue
        g = d.get("group")
        wanted = (f"a group, off (replicas 0; its roles kept: {g['roles']})" if g and g.get("off") else
                  f"a group: {g['roles']}" if g else f"{d['replicas']} replica(s) wanted")
        out.append(f"deployment {d['name']} ({d.get('backend')}): {wanted}"
                   + (", deleting" if d.get("deleting") else "") + f"; requests use \"model\": \"{d['name']}\"")
        out.append(f"  instances: {counts(d['instances'])}")
        if g and g.get("degradations"):
            why = g.get("why") or {}
            out.append("  degraded: " + "; ".join(f"{k} ({why[k]})" if why.get(k) else k for k in g["degradations"]))
        if g and g.get("waiting"):
            out.append(f"  waiting: {g['waiting']}")
        if summary:
            continue
        stated = spec_text.resources({"resources": d.get("resources")})
        if stated:
            out.append(f"  resources: {stated} (the spec's)")
        out.append(f"  {'INSTANCE':<20} {'STATE':<12} {'WORKER':<12} {'GPUS':<8} {'ADDRESS':<21} {'IN-FLIGHT':<9} "
                   f"{'VRAM USED/CLAIMED':<17} REASON")
        for i in d["instances"]:
            gpus = ",".join(map(str, i.get("gpu_indexes") or [])) or "-"
            worker = "+".join([i.get("worker") or "-", *i.get("subordinate_workers", [])])
            reason = i.get("reason") or ""
            if i.get("download"):
                reason = f"{reason}: {progress(i['download'])}"
            reason = "; ".join(x for x in (usage.warning(i.get("vram")), reason) if x)  # over its claim, said first
            name = f"{i['name']} ({i['role']})" if i.get("role") else i["name"]
            out.append(f"  {name:<20} {i['state'].upper():<12} {worker:<12} {gpus:<8} {_serving(i)} "
                       f"{usage.column(i.get('vram')):<17} {reason}")
            out += [f"  {'':<20} | {line}" for line in i.get("log_tail") or []]  # an ERROR replica's log, its end
    if not st["deployments"]:
        out.append("no deployments")
    out += [f"gateway: {u}" for u in st.get("gateways", [])]
    if st.get("hosts"):
        out.append("")
        out.append(f"hosts: {counts(st['hosts'])}" if summary else hosts(st["hosts"]))
    return "\n".join(out)

