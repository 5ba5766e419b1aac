"""Cohorts, lending limits, fair sharing and whole guaranteed GPUs, in Kueue's terms. Pure.

**Lending limits** (Kueue's ``lendingLimit``). A tenant's unused guarantee is lent to borrowers
(any tenant above its own guarantee, or without one) except what its ``lending_limit`` keeps:
kept = max(0, min(guarantee - lending_limit, guarantee - used)). A borrower's replica is refused,
with a quota reason, when after it the cluster's free capacity (GPUs no replica holds; VRAM
unclaimed) is below what the other tenants keep. Per flavor likewise, over that flavor's GPUs.

    b: guarantee 2 GPUs, lending_limit 0, uses 0  -> keeps min(2 - 0, 2 - 0) = 2
    c: guarantee 2 GPUs, lending_limit 1, uses 0  -> keeps min(2 - 1, 2 - 0) = 1
    cluster 6 GPUs, a (no guarantee) holds 2: a third replica leaves 6 - 3 = 3 free >= 2 + 1: placed;
    a fourth leaves 2 < 3: "quota: tenant a would borrow GPUs others keep: b keeps 2, c keeps 1 ..."

Without any lending limit nobody keeps anything: borrowing is what it was (idle capacity, given
back by preemption).

**Cohorts**. Tenants that name one ``cohort`` borrow each other's unused guarantee first: where
the guarantees are per GPU model (flavors), a borrower tries, in order, the GPUs of flavors a
cohort mate guarantees and does not use, then GPUs no other tenant's unused flavor guarantee
covers, then any (``tiers``). A tenant that reclaims its guarantee takes its cohort mates' borrowed
replicas before anyone else's (preemption.victim_order). A tenant without a cohort is in the
cluster's: it borrows anywhere, as before.

**Fair sharing** (``fair_sharing: true``; Kueue's dominant resource share). A tenant's share is
the largest, over resources, of (use above its guarantee) / (the cluster's capacity), divided by
its weight (weight 0: infinite). Among waiting replicas of one tenant priority, the lower share
is admitted first; among victims of one kind, the higher share is preempted first.

    a: guarantee 0, uses 2 of 8 GPUs, 40 of 640 GiB -> max(2/8, 40/640) = 0.25; weight 2 -> 0.125
    b: guarantee 2, uses 3 of 8 GPUs                -> (3-2)/8 = 0.125; weight 1 -> 0.125

**Whole guaranteed GPUs**. A tenant's replicas, in name order (deployment, then replica number),
are *guaranteed* while they stay within its guarantee together; the rest borrow. A GPU holding a guaranteed replica is never
shared with a borrowing replica: a borrower's decision does not see it, and a guaranteed
replica's decision does not see GPUs a borrower holds (it takes them by preemption instead)."""

from __future__ import annotations

import math

from scheduler.cluster import ClusterSnapshot, Instance, WorkerState
from scheduler.naming import natural_key
from scheduler.tenancy.admission import within_guarantee
from scheduler.tenancy.config import RESOURCES, TenantsFile, Tenant
from scheduler.tenancy.flavors import flavor_of, keep_gpus
from scheduler.tenancy.usage import Usage, of_instance
from scheduler.units import GiB

Gpu = tuple[str, int]


def _ready(snap: ClusterSnapshot):
    return [w for w in snap.workers if w.state == WorkerState.READY]


def capacity(snap: ClusterSnapshot) -> Usage:
    """The READY workers' GPUs, VRAM and RAM."""
    ws = _ready(snap)
    return Usage(gpus=sum(len(w.gpus) for w in ws), vram=sum(g.vram_total for w in ws for g in w.gpus),
                 ram=sum(w.ram_total for w in ws))


def _gpus_of(i: Instance):
    yield from ((i.worker, g, i.claim.vram.get(g, 0)) for g in i.gpu_indexes)
    for s in i.subordinates:
        yield from ((s.worker, g, s.claim.vram.get(g, 0)) for g in s.gpu_indexes)


def free(snap: ClusterSnapshot, keep=None) -> Usage:
    """GPUs no replica holds and VRAM unclaimed, on READY workers' GPUs ``keep(worker, gpu)`` accepts."""
    claimed: dict[Gpu, int] = {}
    for i in snap.instances:
        if i.worker is not None:
            for w, g, v in _gpus_of(i):
                claimed[(w, g)] = claimed.get((w, g), 0) + v
    gpus = vram = 0
    for w in _ready(snap):
        for g in w.gpus:
            if keep is None or keep(w.name, g):
                c = claimed.get((w.name, g.index))
                gpus += c is None
                vram += max(0, g.vram_total - (c or 0))
    return Usage(gpus=gpus, vram=vram)


def kept(guarantee: dict[str, int], lending: dict[str, int], used: Usage) -> Usage:
    """What a tenant keeps of its unused guarantee (module docstring: min(g - lend, g - used))."""
    out = {r: max(0, min(g - lending[r], g - getattr(used, r))) for r, g in guarantee.items() if r in lending}
    return Usage(**{r: v for r, v in out.items() if r in ("gpus", "vram")})


def _say(r: str, v: int) -> str:
    return (f"{v} GPU" + ("" if v == 1 else "s")) if r == "gpus" else f"{v / GiB:.1f} GiB VRAM"


def lending_problem(after: ClusterSnapshot, t: Tenant, tenants: TenantsFile, used: dict[str, Usage],
                    fused: dict[str, dict[str, Usage]]) -> str | None:
    """The quota reason when a borrower of ``t`` placed (``after``: the snapshot with it booked)
    leaves less free than the other tenants keep; None otherwise. ``used``: each tenant's use
    before it; ``fused``: each tenant with flavors, its use per flavor."""
    others = [u for u in tenants.tenants if u.name != t.name]
    keeps = {u.name: kept(u.guarantee.named(), u.lending_limit.named(), used.get(u.name, Usage()))
             for u in others if u.lending_limit}
    total = sum(keeps.values(), Usage())
    left = free(after)
    for r in ("gpus", "vram"):
        if getattr(total, r) > getattr(left, r):
            who = ", ".join(f"{n} keeps {_say(r, getattr(k, r))}" for n, k in keys_sorted(keeps) if getattr(k, r))
            return (f"quota: tenant {t.name} would borrow what others keep of their guarantees ({who}; "
                    f"{_say(r, getattr(left, r))} would be left free)")
    for u in others:
        for k, f in (u.flavors or {}).items():
            if f.lending_limit is None:
                continue
            k_use = kept(f.guarantee.named(), f.lending_limit.named(), fused.get(u.name, {}).get(k, Usage()))
            left = free(after, lambda w, g, u=u, k=k: flavor_of(u, g.name) == k)
            for r in ("gpus", "vram"):
                if getattr(k_use, r) > getattr(left, r):
                    return (f"quota: tenant {t.name} would borrow what tenant {u.name} keeps of its {k} guarantee "
                            f"({_say(r, getattr(k_use, r))}; {_say(r, getattr(left, r))} of {k} would be left free)")
    return None


def keys_sorted(d: dict):
    return sorted(d.items())


def mates(t: Tenant, tenants: TenantsFile) -> set[str]:
    """The other tenants of ``t``'s cohort (none without one)."""
    if not t.cohort:
        return set()
    return {u.name for u in tenants.tenants if u.cohort == t.cohort and u.name != t.name}


def unused_flavors(u: Tenant, fused: dict[str, Usage], lent: bool = True) -> set[str]:
    """``u``'s flavors with unused guaranteed GPUs (``lent``: that it lends, some of them)."""
    out = set()
    for k, f in (u.flavors or {}).items():
        g = f.guarantee.gpus
        lend = f.lending_limit.gpus if lent and f.lending_limit and f.lending_limit.gpus is not None else g
        if g and lend and fused.get(k, Usage()).gpus < g:
            out.add(k)
    return out


def tiers(t: Tenant, tenants: TenantsFile, fused: dict[str, dict[str, Usage]]) -> list:
    """The GPUs a borrower of ``t`` tries first, as keep(worker, gpu) predicates, in order
    (module docstring, Cohorts); [] when no flavor guarantee is unused (then: any GPU)."""
    near = mates(t, tenants)
    mine = {u.name: unused_flavors(u, fused.get(u.name, {})) for u in tenants.tenants if u.name != t.name}
    if not any(mine.values()):
        return []
    by = {u.name: u for u in tenants.tenants}
    cohort = [(by[n], ks) for n, ks in mine.items() if n in near and ks]
    far = [(by[n], ks) for n, ks in mine.items() if n not in near and ks]
    out = []
    if cohort:
        out.append(lambda w, g: any(flavor_of(u, g.name) in ks for u, ks in cohort))
    if far:
        out.append(lambda w, g: not any(flavor_of(u, g.name) in ks for u, ks in far))
    return out


def share(t: Tenant, used: Usage, cap: Usage) -> float:
    """``t``'s dominant resource share of what it borrows (module docstring, Fair sharing)."""
    g = t.guaranteed()
    s = max((max(0, getattr(used, r) - g.get(r, 0)) / getattr(cap, r) for r in RESOURCES if getattr(cap, r)),
            default=0.0)
    if s == 0:
        return 0.0
    return math.inf if t.weight == 0 else s / t.weight


def guaranteed(snap: ClusterSnapshot, tenants: TenantsFile, tenant_of: dict[str, str],
               started_at: dict[str, float], per: dict[str, Usage] | None = None) -> set[str]:
    """The replicas within their tenants' guarantees: each tenant's in name order (a deployment's
    lower-numbered replicas first), while together they stay within it (module docstring, Whole
    guaranteed GPUs). Names, not start times: the queue and every decision see the same set,
    and a decision that cannot preempt is not given the booking times. ``started_at`` is unused."""
    with_guarantee = {t.name for t in tenants.tenants if t.guaranteed()}
    by: dict[str, list[Instance]] = {}
    for i in snap.instances:
        t = tenant_of.get(i.model, "default")
        if i.worker is not None and t in with_guarantee:
            by.setdefault(t, []).append(i)
    out: set[str] = set()
    for name, insts in by.items():
        t = tenants.get(name)
        if t is None or not t.guaranteed():
            continue
        acc = Usage()
        for i in sorted(insts, key=lambda i: (i.model, natural_key(i.name))):
            u = per[i.name] if per is not None and i.name in per else of_instance(i)
            if not within_guarantee(t, acc, u):
                break
            acc = acc + u
            out.add(i.name)
    return out


def gpus_of_one(i: Instance) -> set[Gpu]:
    return {(w, g) for w, g, _ in _gpus_of(i)}


def gpus_of(snap: ClusterSnapshot, names: set[str]) -> set[Gpu]:
    return {(w, g) for i in snap.instances if i.name in names and i.worker is not None for w, g, _ in _gpus_of(i)}


def hide(snap: ClusterSnapshot, gpus: set[Gpu]) -> ClusterSnapshot:
    """``snap`` without those GPUs (a decision on it never places there)."""
    return keep_gpus(snap, lambda w, g: (w, g.index) not in gpus) if gpus else snap
