"""Ask the scheduler before scaling up: place k new replicas as a dry run on the snapshot, each
with the earlier dry placements booked, and stop at the first that does not fit. The autoscaler
adds only the j replicas that fit; for the rest it records the scheduler's reasons and reports
the unmet demand (``demand``) to the capacity hook, instead of creating replicas that would sit
PENDING (kubernetes/autoscaler#3869). Pure: the snapshot is not changed."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.cluster import ClusterSnapshot
from scheduler.decide import decide
from scheduler.decision import Candidate
from scheduler.dry_run import book
from scheduler.groups.scale_out import scale_out
from scheduler.groups.spec import RoleName
from scheduler.policy_config import PolicyConfig
from scheduler.request import Request
from scheduler.spec import ModelSpec


@dataclass
class Fit:
    asked: int
    placed: list[Candidate] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # why the first replica that did not fit did not
    after: ClusterSnapshot | None = None  # fit_member's: the snapshot with what fits booked (the next role's dry run)

    @property
    def fits(self) -> int:
        return len(self.placed)

    @property
    def blocked(self) -> bool:
        return self.fits < self.asked


def fit(snapshot: ClusterSnapshot, spec: ModelSpec, request: Request, k: int,
        config: PolicyConfig | None = None) -> Fit:
    """How many of ``k`` new replicas of ``spec`` fit, where, and why the next one does not."""
    out, snap = Fit(asked=k), snapshot
    for i in range(k):
        d = decide(snap, spec, request, config)
        if not d.scheduled:
            out.reasons = list(d.reasons)
            break
        out.placed.append(d.placement)
        snap = book(snap, d.placement, f"{spec.name}~dry-run-{i}", spec.name)
    return out


def fit_member(snapshot: ClusterSnapshot, spec: ModelSpec, role: str, request: Request, group: str, k: int,
               config: PolicyConfig | None = None) -> Fit:
    """How many of ``k`` more ``role`` members of ``spec``'s group fit (each placed alone beside the
    group, as ``place_member`` would: scheduler/groups/scale_out.py), and why the next one does not."""
    out, snap = Fit(asked=k), snapshot
    for i in range(k):
        d = scale_out(snap, spec, RoleName(role), request, group, config)
        if not d.scheduled:
            out.reasons = [f"role {role}: no host fits one more member", *d.reasons]
            break
        out.placed.append(d.placement)
        snap = book(snap, d.placement, f"{group}~dry-run-{role}-{i}", spec.name)
        last = snap.instances[-1].model_copy(update={"role": RoleName(role), "group": group})
        snap = snap.model_copy(update={"instances": [*snap.instances[:-1], last]})
    out.after = snap
    return out


def demand(spec: ModelSpec, request: Request, fit_: Fit) -> dict:
    """The unmet demand, per replica, for a node-pool autoscaler: what one more host must offer."""
    missing = fit_.asked - fit_.fits
    gpus = spec.gpu_selector.gpus_per_replica
    if request.kind == "flat":
        per = {"vram": request.vram, "ram": request.ram}
    else:
        full = request.full
        per = {"vram": sum(v.nonuma for v in full.vrams), "ram": full.ram.nonuma}
    return {"deployment": spec.name, "replicas": missing, "backend": spec.backend.value,
            "per_replica": {"gpus": gpus, "vram_bytes": per["vram"],
                            "vram_per_gpu_bytes": per["vram"] // gpus if gpus else None, "ram_bytes": per["ram"]},
            "worker_selector": dict(spec.worker_selector), "gpu_selector": spec.gpu_selector.model_dump(),
            "cluster": spec.cluster, "reasons": fit_.reasons}
