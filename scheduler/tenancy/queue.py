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
mode. One that does not fit either shows the quota too when it would break it even on an empty
cluster (what it holds there at least): quota is what blocks, not capacity. A tenant with flavors
is decided on its GPU models only, and its flavors' limits hold (flavors.py). A borrower whose
placement would share a GPU with another tenant's guaranteed replica is decided again without
those GPUs, and held, saying so, when that does not place it (admission would refuse it there);
a borrower that would leave less free than others keep by their lending limits is held with
that quota (lending.lending_problem), as admission holds it.

Fair sharing (``fair_sharing: true``): among replicas of one tenant priority, the tenant with the
lower share of what it borrows comes first (``fair_order``; lending.share), as Kueue admits the
lowest dominant-resource share first; the shares count what the pass has woken so far.

Reclaim: with ``quotas`` given, a replica that does not fit, of a tenant that stays within its
guarantee with it (its whole-GPU shape, what it holds on an empty cluster, counting the replicas
woken before it in this pass) while another tenant borrows, is woken too (``Wake.reclaim``): it
decides itself and may preempt. Every replica the guarantee covers is woken in the same pass, so
they decide together and preempt as a group (scheduler/tenancy/group.py), not one per sweep.

Cost: the snapshot only fills during a pass, so once a replica does not fit, every later replica
of a spec that fits the same places (``fit_key``: the spec but its name, tenant, priority and
replica count) is held for the same reason without another decision; once a deployment is over
its quota, so are its later replicas; one held back stays held back until a replica is woken. The
workers a head could use were they empty are worked out only when a lower-priority replica fits
and may have to be held back for it. A pass costs one decision per woken replica and per
distinct spec that waits, not one per PENDING replica."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from scheduler.cluster import ClusterSnapshot
from scheduler.decide import decide
from scheduler.dry_run import book, without
from scheduler.policy_config import PolicyConfig
from scheduler.reasons import pending_text
from scheduler.request import Request
from scheduler.spec import ModelSpec
from scheduler.tenancy import flavors, lending
from scheduler.tenancy.admission import borrowing, over_limit, within_guarantee
from scheduler.tenancy.config import DEFAULT, Tenant, TenantsFile
from scheduler.tenancy.usage import Usage, by_tenant, of_candidate


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
    reclaim: list[str] = field(default_factory=list)  # do not fit, may preempt within their tenant's guarantee
    held: dict[str, str] = field(default_factory=dict)  # instance -> why it waits
    decisions: int = 0  # policy runs this pass took (the cost the memo keeps small)


@dataclass(frozen=True)
class Quotas:
    """Each tenant with a limit or a guarantee (with fair sharing on: every tenant), and what every
    tenant holds now (the ledger's view). ``fused``/``names``: each flavored tenant's use per flavor
    and the GPUs' model names (flavors.py); ``cap``: the cluster's capacity, when fair sharing
    orders the borrowers (lending.share)."""

    tenants: dict[str, Tenant]
    used: dict[str, Usage]
    fused: dict[str, dict[str, Usage]] = field(default_factory=dict)
    names: dict[tuple[str, int], str] = field(default_factory=dict)
    cap: Usage | None = None
    guarded: dict[tuple[str, int], str] = field(default_factory=dict)  # GPU -> tenant of the guaranteed replica on it
    file: TenantsFile | None = None  # the whole file, for the lending limits


def quotas_of(snap: ClusterSnapshot, tf: TenantsFile, tenant_of: dict[str, str]) -> Quotas | None:
    """The queue's Quotas for a tenants file, None when nothing in it bounds or orders anyone."""
    held = {t.name: t for t in tf.tenants if tf.fair_sharing or t.limit.named() or t.guaranteed() or t.flavors}
    if not held:
        return None
    names = flavors.gpu_names(snap) if any(t.flavors for t in held.values()) else {}
    fused = {t.name: flavors.used_by(t, [i for i in snap.instances if tenant_of.get(i.model, "default") == t.name],
                                     names) for t in held.values() if t.flavors}
    guarded = {}
    if any(t.guaranteed() for t in held.values()):  # admit.py rule 5: borrowers are not placed beside them
        kept = lending.guaranteed(snap, tf, tenant_of, {})
        guarded = {x: tenant_of.get(i.model, "default") for i in snap.instances if i.name in kept
                   for x in lending.gpus_of_one(i)}
    return Quotas(held, by_tenant(snap.instances, tenant_of), fused, names,
                  lending.capacity(snap) if tf.fair_sharing else None, guarded, tf)


def fair_order(queue: list[Waiting], quotas: Quotas | None, used: dict[str, Usage] | None = None) -> Iterator[Waiting]:
    """Queue order; with fair sharing, the lower share of what its tenant borrows first among
    replicas of one tenant priority (lending.py, Fair sharing), each share taken from ``used`` as
    it is when the next replica is asked for: the caller adds what it wakes, so a tenant that
    gets a replica in this pass goes behind one whose share is now lower, as Kueue orders its
    heads again after each admission. ``used`` None: the quotas' (a fixed order)."""
    if quotas is None or quotas.cap is None:
        yield from ordered(queue)
        return
    used = quotas.used if used is None else used
    heads: dict[str, deque[Waiting]] = {}
    for w in sorted(queue, key=lambda w: (-w.tenant_priority, *w.rank[1:])):  # each tenant's own order
        heads.setdefault(w.tenant, deque()).append(w)

    def key(t: str) -> tuple:
        w, x = heads[t][0], quotas.tenants.get(t)
        share = lending.share(x, used.get(t, Usage()), quotas.cap) if x is not None else 0.0
        return (-w.tenant_priority, share, *w.rank[1:])

    while heads:  # a merge of the tenants' lines by their heads' keys, now: O(tenants) a replica
        t = min(heads, key=key)
        yield heads[t].popleft()
        if not heads[t]:
            del heads[t]


def ordered(queue: list[Waiting]) -> list[Waiting]:
    return sorted(queue, key=lambda w: w.rank)


FIT_FIELDS_EXCLUDED = {"name", "tenant", "priority", "replicas", "autoscaling", "rollout", "shared_with"}  # no bearing on fit


def fit_key(spec: ModelSpec) -> str:
    """Specs with the same key fit the same places (the name only weighs in the spread score)."""
    return spec.model_dump_json(exclude=FIT_FIELDS_EXCLUDED)


@dataclass
class _Blocked:
    """A head that did not fit; the workers it could use were they empty, worked out when asked."""

    w: Waiting
    spec: ModelSpec
    req: Request
    workers: set[str] | None = None


def to_wake(snap: ClusterSnapshot, queue: list[Waiting], specs: dict[str, tuple[ModelSpec, Request]],
            strict: bool = False, config: PolicyConfig | None = None, quotas: Quotas | None = None) -> Wake:
    """Which PENDING replicas to wake now, in queue order; every other one with its reason."""
    out = Wake()
    blocked: list[_Blocked] = []  # heads that did not fit, in queue order
    unfit: dict[str, str] = {}  # fit key -> why replicas of such a spec do not fit this pass
    over: dict[str, str] = {}  # deployment -> the quota its replicas are over this pass
    used = dict(quotas.used) if quotas else {}
    fused = dict(quotas.fused) if quotas else {}
    quota_ok: dict[str, int] = {}  # deployment -> replicas woken when its quota was last found not to block
    held_back: dict[str, tuple[int, str]] = {}  # deployment -> (replicas woken when it was held back, why)
    empty_snap = without(snap, {i.name for i in snap.instances})

    def could_use(b: _Blocked) -> set[str]:
        if b.workers is None:
            empty = decide(empty_snap, b.spec, b.req, config, exclude=b.w.instance)
            out.decisions += 1
            b.workers = {x for c in empty.candidates for x in c.workers}
        return b.workers

    keys = {dep: fit_key(sr[0]) for dep, sr in specs.items()}
    unfit_held: list[Waiting] = []  # held because they do not fit, in queue order
    for w in fair_order(queue, quotas, used):  # ``used`` grows with each replica woken below
        if w.deployment not in specs:
            out.held[w.instance] = "no estimate yet"
            continue
        spec, req = specs[w.deployment]
        tenant = quotas.tenants.get(w.tenant) if quotas else None
        known = over.get(w.deployment) or unfit.get(keys[w.deployment])
        if known is not None and tenant and known == unfit.get(keys[w.deployment]) \
                and quota_ok.get(w.deployment) != len(out.woken):  # a spec like it did not fit: its quota?
            quota = _quota_on_empty(empty_snap, spec, req, config, w, tenant, quotas, used, fused)
            quota_ok[w.deployment] = len(out.woken)
            if quota:
                out.held[w.instance] = over[w.deployment] = quota
                continue
        if known is None and held_back.get(w.deployment, (-1, ""))[0] == len(out.woken):
            known = held_back[w.deployment][1]  # nothing booked since: the same verdict
        if known is None and strict and blocked:
            known = f"StrictFIFO: behind {blocked[0].w.instance}"
        if known is not None:
            out.held[w.instance] = known
            if unfit.get(keys[w.deployment]) == known:
                unfit_held.append(w)
            continue
        d = decide(flavors.restrict(snap, tenant) if tenant else snap, spec, req, config, exclude=w.instance)
        out.decisions += 1
        if not d.scheduled:
            quota = _quota_on_empty(empty_snap, spec, req, config, w, tenant, quotas, used, fused) if tenant else None
            if quota:  # quota is what blocks: its reason, not unschedulable (it waits on its tenant)
                out.held[w.instance] = over[w.deployment] = quota
                continue
            blocked.append(_Blocked(w, spec, req))
            unfit_held.append(w)
            out.held[w.instance] = unfit[keys[w.deployment]] = pending_text(d.reasons, d.decisive)
            continue
        d, need, fneed, why = _away_from_guaranteed(snap, spec, req, config, w, tenant, quotas, used, fused, d, out)
        if why:
            out.held[w.instance] = why
            continue
        quota = _quota(snap, spec, w, tenant, quotas, used, fused, d, need, fneed)
        if quota:
            out.held[w.instance] = over[w.deployment] = quota
            continue
        lands = set(d.placement.workers)
        ahead = next((b for b in blocked if (b.w.tenant_priority, b.w.priority) > (w.tenant_priority, w.priority)
                      and lands & could_use(b)), None)
        if ahead:
            out.held[w.instance] = (f"held back for {ahead.w.instance} (higher priority) waiting for "
                                    f"{', '.join(sorted(lands))}")
            held_back[w.deployment] = (len(out.woken), out.held[w.instance])
            continue
        out.woken.append(w.instance)
        used[w.tenant] = used.get(w.tenant, Usage()) + need
        if fneed:
            fused[w.tenant] = flavors.add(fused.get(w.tenant, {}), fneed)
        snap = book(snap, d.placement, w.instance, spec.name)
    if quotas and unfit_held:
        _reclaim(out, unfit_held, specs, keys, quotas, used, empty_snap, config, fused)
    return out


def _reclaim(out: Wake, waiting: list[Waiting], specs: dict[str, tuple[ModelSpec, Request]], keys: dict[str, str],
             quotas: Quotas, used: dict[str, Usage], empty_snap: ClusterSnapshot, config: PolicyConfig | None,
             fused: dict[str, dict[str, Usage]] | None = None) -> None:
    """Wake the replicas that do not fit but whose tenant stays within its guarantee with them,
    while another tenant borrows (module docstring, Reclaim). A tenant with unused flavor
    guarantees is costed on those flavors (as admit.py places it)."""
    fused = fused if fused is not None else {}
    lenders = {t for t, u in quotas.used.items()
               if u != Usage() and borrowing(quotas.tenants.get(t) or DEFAULT, u)}
    shape: dict[tuple, tuple | None] = {}  # (fit key, tenant) -> (what a replica holds on an empty cluster, per flavor)
    for w in waiting:
        t = quotas.tenants.get(w.tenant)
        if t is None or not t.guaranteed() or not lenders - {w.tenant}:
            continue
        spec, req = specs[w.deployment]
        k = (keys[w.deployment], w.tenant)
        if k not in shape:
            own = lending.unused_flavors(t, fused.get(w.tenant, {}), lent=False) if t.flavors else None
            seen = flavors.only(empty_snap, t, own) if own else flavors.restrict(empty_snap, t)
            empty = decide(seen, spec, req, config, exclude=w.instance)
            out.decisions += 1
            shape[k] = (of_candidate(empty.placement), flavors.held(t, empty.placement, quotas.names)
                        if t.flavors else None) if empty.scheduled else None
        if shape[k] is None:
            continue
        need, fneed = shape[k]
        if not within_guarantee(t, used.get(w.tenant, Usage()), need, fused.get(w.tenant), fneed):
            continue
        out.reclaim.append(w.instance)
        out.held.pop(w.instance, None)
        used[w.tenant] = used.get(w.tenant, Usage()) + need
        if fneed:
            fused[w.tenant] = flavors.add(fused.get(w.tenant, {}), fneed)


def _away_from_guaranteed(snap: ClusterSnapshot, spec: ModelSpec, req: Request, config: PolicyConfig | None,
                          w: Waiting, tenant: Tenant | None, quotas: Quotas | None, used: dict[str, Usage],
                          fused: dict[str, dict[str, Usage]], d, out: Wake):
    """(decision, what it holds, per flavor, why it waits): a borrower whose placement shares a GPU
    with another tenant's guaranteed replica is decided again without those GPUs (admit.py rule 5)."""
    fl = lambda x: flavors.held(tenant, x, quotas.names) if tenant and tenant.flavors else None  # noqa: E731
    need, fneed = of_candidate(d.placement), fl(d.placement)
    if not (quotas and quotas.guarded and _shares_guaranteed(d.placement, w.tenant, quotas.guarded)) or \
            within_guarantee(tenant or DEFAULT, used.get(w.tenant, Usage()), need, fused.get(w.tenant), fneed):
        return d, need, fneed, None
    hidden = {x for x, t in quotas.guarded.items() if t != w.tenant}
    d = decide(lending.hide(flavors.restrict(snap, tenant) if tenant else snap, hidden), spec, req, config,
               exclude=w.instance)
    out.decisions += 1
    if not d.scheduled:
        return d, None, None, (pending_text(d.reasons, d.decisive) + f"; tenancy: {len(hidden)} GPU(s) hold other "
                               "tenants' guaranteed replicas; a borrowing replica does not share them")
    return d, of_candidate(d.placement), fl(d.placement), None


def _quota(snap: ClusterSnapshot, spec: ModelSpec, w: Waiting, tenant: Tenant | None, quotas: Quotas | None,
           used: dict[str, Usage], fused: dict[str, dict[str, Usage]], d, need: Usage, fneed) -> str | None:
    """The quota placing ``d`` would break: a limit, or (a borrower) what others keep by their
    lending limits (lending.lending_problem, as admission checks it)."""
    if quotas is None:
        return None
    q = over_limit(tenant, used.get(w.tenant, Usage()), need, fused.get(w.tenant), fneed) if tenant else None
    t = tenant or (quotas.file.get(w.tenant) if quotas.file else None) or DEFAULT
    if q or quotas.file is None or not any(x.lending_limit or any(f.lending_limit for f in (x.flavors or {}).values())
                                           for x in quotas.file.tenants):
        return q
    if within_guarantee(t, used.get(w.tenant, Usage()), need, fused.get(w.tenant), fneed):
        return None
    return lending.lending_problem(book(snap, d.placement, w.instance, spec.name), t, quotas.file, used, fused)


def _shares_guaranteed(c, tenant: str, guarded: dict[tuple[str, int], str]) -> bool:
    """Whether placement ``c`` holds a GPU another tenant's guaranteed replica holds."""
    gpus = [(c.worker, i) for i in c.gpu_indexes] + [(sub.worker, i) for sub in c.subordinates for i in sub.gpu_indexes]
    return any(guarded.get(x, tenant) != tenant for x in gpus)


def _quota_on_empty(empty_snap: ClusterSnapshot, spec: ModelSpec, req: Request, config: PolicyConfig | None,
                    w: Waiting, tenant: Tenant, quotas: Quotas, used: dict[str, Usage],
                    fused: dict[str, dict[str, Usage]]) -> str | None:
    """The quota a replica that does not fit would break even on an empty cluster (what it holds
    there at least), for a tenant with a limit; None otherwise."""
    if not tenant.limit.named() and not any(f.limit.named() for f in (tenant.flavors or {}).values()):
        return None
    empty = decide(flavors.restrict(empty_snap, tenant), spec, req, config, exclude=w.instance)
    if not empty.scheduled:
        return None
    fneed = flavors.held(tenant, empty.placement, quotas.names) if tenant.flavors else None
    return over_limit(tenant, used.get(w.tenant, Usage()), of_candidate(empty.placement), fused.get(w.tenant), fneed)
