"""The one queue of PENDING replicas, and which of them to wake when capacity frees.

Order: tenant priority (high first), then deployment priority, then arrival, then the name.
Only heads that now fit are woken, in that order, each booked on the dry snapshot before the
next is tried, so the wake-ups never exceed what frees up (no thundering herd).

``BestEffortFIFO`` (default, Kueue's name): a head that does not fit does not block smaller
replicas behind it, but it does hold back replicas of lower priority that would land on a worker
it is waiting for (one where it would fit were the worker empty): they would take that capacity.
Replicas of its own priority are not held back. ``StrictFIFO``: nothing behind a head that does
not fit is woken."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.cluster import ClusterSnapshot
from scheduler.decide import decide
from scheduler.dry_run import book, without
from scheduler.policy_config import PolicyConfig
from scheduler.request import Request
from scheduler.spec import ModelSpec


@dataclass(frozen=True)
class Waiting:
    instance: str
    deployment: str
    tenant_priority: int = 0
    priority: int = 0
    arrived: float = 0.0

    @property
    def rank(self) -> tuple:
        return (-self.tenant_priority, -self.priority, self.arrived, self.instance)


@dataclass
class Wake:
    woken: list[str] = field(default_factory=list)
    held: dict[str, str] = field(default_factory=dict)  # instance -> why it waits


def ordered(queue: list[Waiting]) -> list[Waiting]:
    return sorted(queue, key=lambda w: w.rank)


def to_wake(snap: ClusterSnapshot, queue: list[Waiting], specs: dict[str, tuple[ModelSpec, Request]],
            strict: bool = False, config: PolicyConfig | None = None) -> Wake:
    """Which PENDING replicas to wake now, in queue order; every other one with its reason."""
    out = Wake()
    blocked: list[tuple[Waiting, set[str]]] = []  # heads that did not fit, with the workers they could use
    for w in ordered(queue):
        if w.deployment not in specs:
            out.held[w.instance] = "no estimate yet"
            continue
        spec, req = specs[w.deployment]
        if strict and blocked:
            out.held[w.instance] = f"StrictFIFO: behind {blocked[0][0].instance}"
            continue
        d = decide(snap, spec, req, config, exclude=w.instance)
        if not d.scheduled:
            empty = decide(without(snap, {i.name for i in snap.instances}), spec, req, config, exclude=w.instance)
            blocked.append((w, {x for c in empty.candidates for x in c.workers}))
            out.held[w.instance] = "; ".join(d.reasons[-2:]) or "does not fit"
            continue
        lands = set(d.placement.workers)
        ahead = next((b for b, ws in blocked if (b.tenant_priority, b.priority) > (w.tenant_priority, w.priority)
                      and lands & ws), None)
        if ahead:
            out.held[w.instance] = f"held back for {ahead.instance} (higher priority) waiting for {', '.join(sorted(lands))}"
            continue
        out.woken.append(w.instance)
        snap = book(snap, d.placement, w.instance, spec.name)
    return out
