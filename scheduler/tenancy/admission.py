"""Limits and guarantees, per resource. A replica that would take its tenant over a limit stays
PENDING with the quota named first. A tenant borrows when it uses more than its guarantee of a
resource the guarantee names; a tenant with no guarantee borrows whatever it uses.

Flavors (GPU models, scheduler/tenancy/flavors.py): given what the tenant holds on each of its
flavors (``fused``) and what the replica would (``fneed``), a flavor's limit holds for the
replicas on it, and a replica is within the guarantee when every flavor it touches is within
that flavor's guarantee (or, for a flavor without one, within the tenant's overall guarantee).
Without them (the ledger's checks, which know no GPU models) a tenant's guarantee of a resource
is its overall one, else the sum of its flavors' (Tenant.guaranteed)."""

from __future__ import annotations

from scheduler.tenancy.config import RESOURCES, Tenant
from scheduler.tenancy.usage import Usage
from scheduler.units import GiB


Flavored = dict[str, Usage]  # flavor key -> use on GPUs of that flavor


def over_limit(t: Tenant, used: Usage, need: Usage, fused: Flavored | None = None,
               fneed: Flavored | None = None) -> str | None:
    """The quota reason if ``need`` on top of ``used`` breaks one of ``t``'s limits (a flavor's:
    ``fneed`` on top of ``fused``, for a flavor the replica touches), else None."""
    for k, u in (fneed or {}).items():
        f = (t.flavors or {}).get(k)
        for r, lim in (f.limit.named() if f else {}).items():
            have, want = getattr((fused or {}).get(k, Usage()), r), getattr(u, r)
            if want and have + want > lim:
                if r == "gpus":
                    return f"quota: tenant {t.name} uses {have} of its {lim} {k} GPUs (this replica needs {want})"
                return (f"quota: tenant {t.name} uses {have / GiB:.1f} GiB of its {lim / GiB:.1f} GiB {r} limit on "
                        f"{k} GPUs (this replica needs {want / GiB:.1f} GiB)")
    for r, lim in t.limit.named().items():
        have, want = getattr(used, r), getattr(need, r)
        if have + want > lim:
            if r == "gpus":
                return f"quota: tenant {t.name} uses {have} of its {lim} GPUs (this replica needs {want})"
            return (f"quota: tenant {t.name} uses {have / GiB:.1f} GiB of its {lim / GiB:.1f} GiB {r} limit "
                    f"(this replica needs {want / GiB:.1f} GiB)")
    return None


def _within(g: dict[str, int], used: Usage, need: Usage) -> bool:
    return all(getattr(used, r) + getattr(need, r) <= x for r, x in g.items())


def within_guarantee(t: Tenant, used: Usage, need: Usage, fused: Flavored | None = None,
                     fneed: Flavored | None = None) -> bool:
    """``need`` on top of ``used`` stays within every resource ``t``'s guarantee names (a tenant
    with no guarantee has none); with ``fneed``, each flavor it touches within its own too."""
    top = t.guarantee.named()
    if fneed is None or not t.flavors:
        g = t.guaranteed()
        return bool(g) and _within(g, used, need)
    if top and not _within(top, used, need):
        return False
    for k, u in fneed.items():
        f = t.flavors.get(k)
        g = f.guarantee.named() if f else {}
        if g and not _within(g, (fused or {}).get(k, Usage()), u):
            return False
        if not g and not top:
            return False  # a model it has no guarantee of, and no overall one
    return bool(top) or bool(fneed)


def borrowing(t: Tenant, used: Usage, fused: Flavored | None = None) -> bool:
    """Uses more than its guarantee of a resource the guarantee names; a tenant with no
    guarantee borrows whatever it uses. With ``fused``: more than a flavor's guarantee too, or
    any use of a flavor without one when there is no overall guarantee."""
    g = t.guaranteed()
    if not g:
        return any(getattr(used, r) > 0 for r in RESOURCES)
    if any(getattr(used, r) > x for r, x in g.items()):
        return True
    top = t.guarantee.named()
    for k, u in (fused or {}).items():
        f = (t.flavors or {}).get(k)
        fg = f.guarantee.named() if f else {}
        if any(getattr(u, r) > x for r, x in fg.items()) or not fg and not top and u != Usage():
            return True
    return False
