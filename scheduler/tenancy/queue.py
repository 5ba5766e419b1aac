"""The one queue of PENDING replicas, and which of them to wake when capacity frees.

Order: tenant priority (high first), then deployment priority, then arrival, then the name.
Only heads that now fit are woken, in that order, each booked on the dry snapshot before the
next is tried, so the wake-ups never exceed what frees up (no thundering herd).

``BestEffortFIFO`` (default, Kueue's name): a head that does not fit does not block smaller
replicas behind it, but it does hold back replicas of lower priority that would land on a worker
it is waiting for (one where it would fit were the worker empty): they would take that capacity.
Replicas of its own priority are not held back. ``StrictFIFO``: nothing behind a head that does
not fit is woken.

Quota: with ``tenants`` given, a replica that fits but would take its tenant over a limit
(admission.over_limit, counting the replicas woken before it in this pass) is held with the
quota as its reason. It waits on its own tenant, not on capacity, so it blocks nobody, in either
mode.

Cost: the snapshot only fills during a pass, so once a deployment's replica does not fit (or is
over its quota) every later replica of that deployment is held for the same reason without
another decision, and one held back stays held back until a replica is woken: a pass costs one decision per woken replica and per deployment that waits,
not one per PENDING replica."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.cluster import ClusterSnapshot
from scheduler.decide import decide
from scheduler.dry_run import book, without
from scheduler.policy_config import PolicyConfig
from scheduler.request import Request
from scheduler.spec import ModelSpec
from scheduler.tenancy.admission import over_limit
from scheduler.tenancy.config import Tenant
from scheduler.tenancy.usage import Usage, of_candidate


@dataclass(frozen=True)
class Waiting:
    instance: str
    deployment: str
    tenant_priority: int = 0
    priority: int = 0
    arrived: float = 0.0
    tenant: str = "default"

    @property
    def rank(self) -> tuple:
        return (-self.tenant_priority, -self.priority, self.arrived, self.instance)


@dataclass
class Wake:
    woken: list[str] = field(default_factory=list)
    held: dict[str, str] = field(default_factory=dict)  # instance -> why it waits
    decisions: int = 0  # policy runs this pass took (the cost the memo keeps small)


@dataclass(frozen=True)
class Quotas:
    """Each tenant's definition and what it holds now (the ledger's view)."""

    tenants: dict[str, Tenant]
    used: dict[str, Usage]


def ordered(queue: list[Waiting]) -> list[Waiting]:
    return sorted(queue, key=lambda w: w.rank)


def to_wake(snap: ClusterSnapshot, queue: list[Waiting], specs: dict[str, tuple[ModelSpec, Request]],
            strict: bool = False, config: PolicyConfig | None = None, quotas: Quotas | None = None) -> Wake:
    """Which PENDING replicas to wake now, in queue order; every other one with its reason."""
    out = Wake()
    blocked: list[tuple[Waiting, set[str]]] = []  # heads that did not fit, with the workers they could use
    unfit: dict[str, str] = {}  # deployment -> why its replicas do not fit (or are over quota) this pass
    used = dict(quotas.used) if quotas else {}
    held_back: dict[str, tuple[int, str]] = {}  # deployment -> (replicas woken when it was held back, why)
    for w in ordered(queue):
        if w.deployment not in specs:
            out.held[w.instance] = "no estimate yet"
            continue
        spec, req = specs[w.deployment]
        if w.deployment in unfit:
            out.held[w.instance] = unfit[w.deployment]
            continue
        if held_back.get(w.deployment, (-1, ""))[0] == len(out.woken):  # nothing booked since: the same verdict
            out.held[w.instance] = held_back[w.deployment][1]
            continue
        if strict and blocked:
            out.held[w.instance] = f"StrictFIFO: behind {blocked[0][0].instance}"
            continue
        d = decide(snap, spec, req, config, exclude=w.instance)
        out.decisions += 1
        if not d.scheduled:
            empty = decide(without(snap, {i.name for i in snap.instances}), spec, req, config, exclude=w.instance)
            out.decisions += 1
            blocked.append((w, {x for c in empty.candidates for x in c.workers}))
            out.held[w.instance] = unfit[w.deployment] = "does not fit: " + ("; ".join(d.reasons[:min(2, d.decisive or 2)])
                                                                   or "no candidate")
            continue
        tenant = quotas.tenants.get(w.tenant) if quotas else None
        need = of_candidate(d.placement)
        quota = over_limit(tenant, used.get(w.tenant, Usage()), need) if tenant else None
        if quota:
            out.held[w.instance] = unfit[w.deployment] = quota
            continue
        lands = set(d.placement.workers)
        ahead = next((b for b, ws in blocked if (b.tenant_priority, b.priority) > (w.tenant_priority, w.priority)
                      and lands & ws), None)
        if ahead:
            out.held[w.instance] = f"held back for {ahead.instance} (higher priority) waiting for {', '.join(sorted(lands))}"
            held_back[w.deployment] = (len(out.woken), out.held[w.instance])
            continue
        out.woken.append(w.instance)
        used[w.tenant] = used.get(w.tenant, Usage()) + need
        snap = book(snap, d.placement, w.instance, spec.name)
    return out
