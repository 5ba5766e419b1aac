"""Limits and guarantees, per resource. A replica that would take its tenant over a limit stays
PENDING with the quota named first. A tenant borrows when it uses more than its guarantee of a
resource the guarantee names; a tenant with no guarantee borrows whatever it uses."""

from __future__ import annotations

from scheduler.tenancy.config import RESOURCES, Tenant
from scheduler.tenancy.usage import Usage
from scheduler.units import GiB


def over_limit(t: Tenant, used: Usage, need: Usage) -> str | None:
    """The quota reason if ``need`` on top of ``used`` breaks one of ``t``'s limits, else None."""
    for r, lim in t.limit.named().items():
        have, want = getattr(used, r), getattr(need, r)
        if have + want > lim:
            if r == "gpus":
                return f"quota: tenant {t.name} uses {have} of its {lim} GPUs (this replica needs {want})"
            return (f"quota: tenant {t.name} uses {have / GiB:.1f} GiB of its {lim / GiB:.1f} GiB {r} limit "
                    f"(this replica needs {want / GiB:.1f} GiB)")
    return None


def within_guarantee(t: Tenant, used: Usage, need: Usage) -> bool:
    """``need`` on top of ``used`` stays within every resource ``t``'s guarantee names (a tenant
    with no guarantee has none)."""
    named = t.guarantee.named()
    return bool(named) and all(getattr(used, r) + getattr(need, r) <= g for r, g in named.items())


def borrowing(t: Tenant, used: Usage) -> bool:
    """Uses more than its guarantee of a resource the guarantee names; a tenant with no
    guarantee borrows whatever it uses."""
    named = t.guarantee.named()
    if not named:
        return any(getattr(used, r) > 0 for r in RESOURCES)
    return any(getattr(used, r) > g for r, g in named.items())
