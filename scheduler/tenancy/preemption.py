"""Preemption, pure: which running replicas a PENDING one may take the place of, proven by a dry
run before any victim is touched. Kueue's classical preemption is the anchor
(pkg/scheduler/preemption), with the replica as the unit (kueue#3762 asks for exactly that).

Who may be a victim:
- the preemptor's tenant stays within its guarantee with this replica: replicas of tenants that
  borrow (use more than their guarantee), only while they still borrow as victims are taken;
- otherwise (it would borrow itself): only idle capacity, except that within its own tenant a
  higher-priority deployment may preempt a lower one.
So a victim can never preempt its preemptor back: the preemptor's tenant is within its guarantee
afterwards (it does not borrow), and within a tenant priority must be strictly higher.

Victim order (Kueue's ordering.go, in our terms): replicas of borrowing tenants first (other
tenants before the preemptor's own), the preemptor's cohort mates first among them (they borrowed
its cohort's guarantee first: lending.py), then with fair sharing on the highest share of what
its tenant borrows, then lower tenant priority, then lower deployment priority,
then the most recently started, then the name. The set is minimal: remove victims in that order
until a dry run places the preemptor, then add back, in reverse, every victim it still fits
without. No preemption happens unless the dry run on the snapshot without the victims places it."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.cluster import ClusterSnapshot, Instance
from scheduler.decide import decide
from scheduler.decision import Candidate
from scheduler.dry_run import without
from scheduler.policy_config import PolicyConfig
from scheduler.request import Request
from scheduler.spec import ModelSpec
from scheduler.tenancy.admission import borrowing, over_limit, within_guarantee
from scheduler.tenancy.config import DEFAULT, TenantsFile
from scheduler.tenancy.lending import capacity, mates, share
from scheduler.tenancy.usage import Usage, by_tenant, of_candidate, of_instance


@dataclass(frozen=True)
class Owners:
    """Who owns what: deployment -> (tenant, deployment priority), and when each instance started."""

    tenant_of: dict[str, str]
    priority_of: dict[str, int]
    started_at: dict[str, float]


@dataclass
class Preemption:
    placement: Candidate | None
    victims: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    why: str = ""  # the victims' line: "to reclaim prod's guarantee" | "for a higher-priority deployment"


def victim_order(cands: list[Instance], tenants: TenantsFile, o: Owners, mine: str, used: dict[str, Usage],
                 cap: Usage | None = None) -> list[Instance]:
    """Module docstring's order; cohorts and fair sharing (lending.py) after "borrowing, of
    another tenant": the preemptor's cohort mates first, then (``cap`` given: fair sharing on)
    the highest share of what it borrows."""
    near = mates(tenants.get(mine) or DEFAULT, tenants)

    def key(i: Instance):
        t = o.tenant_of.get(i.model, "default")
        tn = tenants.get(t) or DEFAULT
        u = used.get(t, Usage())
        return (0 if t != mine and borrowing(tn, u) else 1, 0 if t in near else 1,
                -share(tn, u, cap) if cap is not None else 0.0, tn.priority,
                o.priority_of.get(i.model, 0), -o.started_at.get(i.name, 0.0), i.name)

    return sorted(cands, key=key)


def _seen(snap: ClusterSnapshot, view) -> ClusterSnapshot:
    """What the preemptor's decision sees (admit.py: its flavors, GPUs it may not share); ``view``
    runs after the victims are gone, so the GPUs they free show."""
    return view(snap) if view is not None else snap


def _greedy(snap: ClusterSnapshot, spec: ModelSpec, request: Request, config, name: str, ordered: list[Instance],
            tenants: TenantsFile, o: Owners, mine: str, used: dict[str, Usage], whole: bool = False,
            view=None) -> list[Instance] | None:
    """Victims in order until a dry run on ``snap`` without them places the preemptor (a tenant
    back within its guarantee gives no more), then fill-back: every victim it still fits
    without, tried in reverse, is spared. None when even all of them do not make room."""
    fits = lambda gone: decide(_seen(without(snap, {x.name for x in gone}), view), spec, request, config,  # noqa: E731
                               exclude=name, whole_only=whole).scheduled
    taken, left = [], dict(used)
    for v in ordered:
        t = o.tenant_of.get(v.model, "default")
        if t != mine and not borrowing(tenants.get(t), left.get(t, Usage())):
            continue  # that tenant is back within its guarantee: no more of its replicas
        taken.append(v)
        left[t] = left.get(t, Usage()) - of_instance(v)
        if fits(taken):
            break
    else:
        return None
    for v in reversed(list(taken)):
        if fits([x for x in taken if x is not v]):
            taken.remove(v)
    return taken


def _touches(i: Instance, w: str) -> bool:
    return i.worker == w or any(s.worker == w for s in i.subordinates)


def _per_worker(snap, spec, request, config, name, ordered, tenants, o, mine, used, whole=False,
                view=None) -> list[Instance] | None:
    """A preemptor that fits on one worker (the empty-cluster probe placed it on one): the greedy
    search runs per worker, on a snapshot of that worker alone, and the set whose victims come
    earliest in the victim order wins (then the fewest, then the worker's name). Each dry run
    then costs one worker, not the cluster: victims spread one per worker stay linear."""
    rank = {v.name: n for n, v in enumerate(ordered)}
    best: tuple | None = None
    for w in sorted({x for v in ordered for x in (v.worker, *(s.worker for s in v.subordinates))}):
        mine_here = [v for v in ordered if _touches(v, w)]
        sub = snap.model_copy(update={"workers": [x for x in snap.workers if x.name == w],
                                      "instances": [i for i in snap.instances if _touches(i, w)],
                                      "model_files": [f for f in snap.model_files if f.worker == w]})
        if not decide(_seen(without(sub, {v.name for v in mine_here}), view), spec, request, config, exclude=name,
                      whole_only=whole).scheduled:
            continue  # not even every candidate here makes room
        taken = _greedy(sub, spec, request, config, name, mine_here, tenants, o, mine, used, whole, view)
        if taken:
            key = (max(rank[v.name] for v in taken), len(taken), w)
            if best is None or key < best[0]:
                best = (key, taken)
    return best[1] if best else None


def plan(snap: ClusterSnapshot, spec: ModelSpec, request: Request, tenants: TenantsFile, owners: Owners,
         name: str, config: PolicyConfig | None = None, whole_only: bool = False, view=None,
         flavored=None) -> Preemption:
    """Where the PENDING replica ``name`` of ``spec`` goes, taking the fewest victims; no
    placement (and no victims) when it cannot be placed even so. ``whole_only``: every dry run
    refuses placements in slivers of partly full GPUs (scheduler/scorers/fragmentation.py).
    ``view``: what each dry run sees of a snapshot (``_seen``); ``flavored(candidate)``: (the
    tenant's use per flavor, the candidate's) for the flavors' limits and guarantees."""
    mine = owners.tenant_of.get(spec.name, "default")
    me, my_prio = tenants.get(mine), owners.priority_of.get(spec.name, 0)
    used = by_tenant(snap.instances, owners.tenant_of)
    fl = flavored or (lambda c: (None, None))
    d = decide(_seen(snap, view), spec, request, config, exclude=name, whole_only=whole_only)
    if d.scheduled:
        return Preemption(d.placement, reasons=d.reasons)
    probe = decide(_seen(without(snap, {i.name for i in snap.instances if i.name != name}), view), spec, request,
                   config, exclude=name)
    if not probe.scheduled:
        return Preemption(None, reasons=d.reasons + ["preemption: it does not fit even on an empty cluster"])
    need = of_candidate(probe.placement)
    reclaim = within_guarantee(me, used.get(mine, Usage()), need, *fl(probe.placement))
    cands = [i for i in snap.instances if i.name != name and i.worker is not None
             and (owners.tenant_of.get(i.model, "default") != mine and reclaim
                  or owners.tenant_of.get(i.model, "default") == mine and owners.priority_of.get(i.model, 0) < my_prio)]
    ordered = victim_order(cands, tenants, owners, mine, used, capacity(snap) if tenants.fair_sharing else None)
    search = _per_worker if not probe.placement.subordinates else _greedy  # across workers: the whole cluster
    taken = search(snap, spec, request, config, name, ordered, tenants, owners, mine, used, whole_only, view)
    if taken is None:
        return Preemption(None, reasons=d.reasons + [f"preemption: no set of preemptible replicas makes room "
                                                     f"({len(cands)} candidates)"])
    final = decide(_seen(without(snap, {x.name for x in taken}), view), spec, request, config, exclude=name,
                   whole_only=whole_only)
    if not final.scheduled:  # the proof on the whole cluster: no victim unless it places the preemptor
        return Preemption(None, reasons=d.reasons + ["preemption: the dry run without the victims does not place it"])
    limit = over_limit(me, used.get(mine, Usage()), of_candidate(final.placement), *fl(final.placement))
    if limit:
        return Preemption(None, reasons=[limit])
    cross = any(owners.tenant_of.get(v.model, "default") != mine for v in taken)
    if cross and not within_guarantee(me, used.get(mine, Usage()), of_candidate(final.placement), *fl(final.placement)):
        return Preemption(None, reasons=d.reasons + [f"preemption: the placement found would take {mine} past "
                                                     f"its guarantee"])
    why = f"to reclaim {mine}'s guarantee" if cross else "for a higher-priority deployment of its tenant"
    return Preemption(final.placement, victims=[v.name for v in taken], reasons=final.reasons, why=why)
