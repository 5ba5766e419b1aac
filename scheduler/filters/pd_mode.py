"""A prefill/decode group's members only (filters.member_chain): keep the workers that can carry
the group's KV hand-off (GPUStack 2.3.0's PDModeRuntimeFilter, narrowed further by what the agent
reports).

- Vendor: a worker none of whose GPUs is of a vendor the mode's connector talks to is out (the
  recipe's vendors, assets/pd-modes.yaml gpu_filters; ``disaggregation.vendor`` narrows them, never
  widens). ``custom`` declares no vendor: only an explicit ``disaggregation.vendor`` narrows it. A
  worker with no GPU reports no vendor and is out whenever a vendor is required, the router's
  included, as in GPUStack.
- Connector: where a worker reports ``kv_connectors`` (not None), a prefill or decode member whose
  mode needs nixl or mooncake goes only where the worker's engines can run it. The router speaks
  HTTP to the members and carries no KV: the connector does not bind it. None: not reported, kept.
"""

from __future__ import annotations

from scheduler.filters.chain import verdict
from scheduler.groups.spec import MODE_CONNECTOR, MODE_VENDORS, RoleName

NAME = "pd_mode"


def wanted_vendors(mode, chosen: str | None) -> set[str] | None:
    """The vendors a group of ``mode`` may run on; None: any."""
    recipe = MODE_VENDORS[mode]
    mine = {chosen.lower()} if chosen else None
    if recipe is None:
        return mine
    return set(recipe) if mine is None else set(recipe) & mine


class Filter:
    """The PD-mode filter for one member of ``spec``'s group (``spec``: the group's own spec, whose
    ``disaggregation`` the role's effective spec no longer carries)."""

    name = NAME

    def __init__(self, spec, role: RoleName | None = None) -> None:
        d = spec.disaggregation
        self.mode = d.mode if d else None
        self.chosen = d.vendor if d else None
        self.vendors = wanted_vendors(self.mode, self.chosen) if d else None
        carries_kv = role is None or RoleName(role) != RoleName.ROUTER
        self.connector = MODE_CONNECTOR[self.mode] if d and carries_kv else None

    def applies(self, ctx) -> bool:
        return self.vendors is not None or self.connector is not None

    def _why(self, w) -> list[str]:
        out = []
        if self.vendors is not None:
            have = sorted({g.vendor.lower() for g in w.gpus})
            if not set(have) & self.vendors:
                by = f"disaggregation.vendor {self.chosen}" if self.chosen else f"pd mode {self.mode.value}"
                out.append(f"its GPUs' vendor ({', '.join(have) or 'none: no GPU'}) is not "
                           f"{'/'.join(sorted(self.vendors)) or 'any vendor'}, required by {by}")
        if self.connector and w.kv_connectors is not None and self.connector not in {c.lower() for c in w.kv_connectors}:
            out.append(f"its engines cannot run the {self.connector} KV connector pd mode {self.mode.value} needs "
                       f"(it reports: {', '.join(w.kv_connectors) or 'none'})")
        return out

    def run(self, ctx, workers):
        removed = {w.name: r for w in workers if (r := self._why(w))}
        note = None
        if removed:
            n = len(workers) - len(removed)
            note = f"Matched {n}/{len(workers)} workers by pd mode {self.mode.value}."
        return verdict(NAME, workers, removed, note)
