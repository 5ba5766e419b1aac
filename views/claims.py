"""``gpuflow claims`` and the console's Claims page: each fingerprint's learned claim, read from the
store (store/claims.py), beside the replicas that run it now (their measured rows,
store/usage.py) and what the learned claim would change.

A row (JSON-able) per fingerprint: its key and label, the deployments that use it (each with its
mode: the spec's ``claims``, else the cluster's), the live replicas measured with it and what they
are booked and use, the estimate and the weights (where a placement told them), the learned claim
and the recommender's figures, and ``change``: per replica, the learned claim less what is booked
(negative: smaller), and ``frees``: what booking it would free over the live replicas (0 when it
is larger). In ``advise`` that is advice; in ``apply`` it takes effect at each replica's next
placement (a running replica is never resized in place)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from scheduler.claims.fingerprint import fingerprint
from scheduler.claims.recommender import recommend
from scheduler.claims.settings import ClaimSettings
from store.claims import ClaimRow
from store.tables import DeploymentRow, InstanceRow
from store.usage import InstanceUsageRow, UsageProfileRow


def _specs(s: Session, names: set[str]) -> dict[str, dict]:
    if not names:
        return {}
    return {d.name: d.spec or {} for d in s.exec(select(DeploymentRow).where(DeploymentRow.name.in_(list(names))))}


def _mode(spec: dict, settings: ClaimSettings) -> str:
    m = spec.get("claims")
    return m if m in ("advise", "apply") else settings.mode.value


def _live(s: Session) -> dict[str, list[dict[str, Any]]]:
    """fingerprint key -> the replicas measured now with it: {instance, deployment, booked, used, peak}."""
    profiles = {p.key: p for p in s.exec(select(UsageProfileRow))}
    rows = [r for r in s.exec(select(InstanceUsageRow)) if r.profile in profiles and r.measured != "none"]
    owners = {i.name: i for i in s.exec(select(InstanceRow).where(InstanceRow.name.in_([r.instance for r in rows])))} \
        if rows else {}
    specs = _specs(s, {i.deployment for i in owners.values()})
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        p, inst = profiles[r.profile], owners.get(r.instance)
        if inst is None or (inst.placement or {}).get("subordinates"):
            continue  # across hosts: store/claims.py learns nothing from it either
        version = (specs.get(inst.deployment) or {}).get("backend_version") or ""
        fp = fingerprint(p.source, p.backend, p.parameters, p.gpu_model,
                         backend_version=version if isinstance(version, str) else "")
        out.setdefault(fp.key, []).append(dict(instance=r.instance, deployment=inst.deployment, booked=r.vram_claimed,
                                               used=r.vram_used, peak=r.vram_peak))
    return out


def row(c: ClaimRow, live: list[dict[str, Any]], modes: dict[str, str], settings: ClaimSettings,
        now: float) -> dict[str, Any]:
    rec = recommend(c.claim_state(), settings, now, estimate_bytes=c.estimate or None, weights_bytes=c.weights)
    deps = list(dict.fromkeys([x["deployment"] for x in live] + list(c.deployments or [])))
    learned = rec.claim_bytes if rec.confident else None
    return {"fingerprint": c.key, "label": c.label(), "source": c.source, "backend": c.backend,
            "backend_version": c.backend_version, "params": c.params, "gpu_model": c.gpu_model,
            "deployments": [{"name": d, "mode": modes.get(d, settings.mode.value)} for d in deps],
            **figures(live, learned, c.claimed), "estimate": c.estimate or None, "weights": c.weights or None,
            "learned": rec.claim_bytes, "confident": rec.confident, "confidence": rec.confidence,
            "samples": rec.samples, "span_s": rec.span_s, "peak": rec.peak_bytes, "percentile": rec.percentile,
            "percentile_bytes": rec.percentile_bytes, "margin": rec.margin, "bump": rec.bump_bytes,
            "bump_why": rec.bump_why, "reason": rec.reason, "live": live,
            "updated_at": c.updated_at.isoformat() if c.updated_at else None}


def figures(live: list[dict[str, Any]], learned: int | None, claimed: int) -> dict[str, Any]:
    """What the live replicas ``live`` are booked and use, and what the confident ``learned`` claim
    would change (per replica) and free (over them)."""
    booked = [x["booked"] for x in live if x["booked"]]  # each replica's, as booked now
    return {"replicas": len(live), "booked": max(booked) if booked else claimed, "booked_total": sum(booked),
            "used_total": sum(x["used"] for x in live),
            "change": (learned - max(booked)) if learned is not None and booked else None,
            "frees": sum(max(0, b - learned) for b in booked) if learned is not None else 0}


def restricted(r: dict[str, Any], names: set[str]) -> dict[str, Any]:
    """A row as a caller who sees only the deployments ``names`` may see it: those deployments, and
    the figures of their live replicas alone (the learned claim is the fingerprint's, shared)."""
    live = [x for x in r["live"] if x["deployment"] in names]
    return {**r, "deployments": [d for d in r["deployments"] if d["name"] in names], "live": live,
            **figures(live, r["learned"] if r["confident"] else None, r["booked"])}


def claims(engine: Engine, settings: ClaimSettings, now: float) -> dict[str, Any]:
    """{mode, settings, claims: [row]}: every fingerprint, the most samples first."""
    with Session(engine) as s:
        live = _live(s)
        found = list(s.exec(select(ClaimRow)))
        specs = _specs(s, {d for c in found for d in c.deployments or []} | {x["deployment"] for v in live.values()
                                                                            for x in v})
    modes = {name: _mode(spec, settings) for name, spec in specs.items()}
    rows = [row(c, live.get(c.key, []), modes, settings, now) for c in found]
    rows.sort(key=lambda r: (-r["samples"], r["label"]))
    return {"mode": settings.mode.value, "settings": settings.model_dump(mode="json"), "claims": rows}
