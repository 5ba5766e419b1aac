"""A group's members placed after its formation (a scaled-out prefill or decode, a late router):
under MustGather, keep only the workers inside the floor, the one domain of the gather layer that
holds the group's placed prefill and decode members (GPUStack 2.3.0's GatherFloorFilter;
groups/domains.py floor). PreferGather is a target, not a floor: it filters nothing (a looser
placement is reported as gather_unmet). Nothing to keep to (no member placed, the members in no
classified domain of the layer or in several): the filter does not run, as GPUStack's says nothing.

Formation does not run it: the group solver (groups/form.py) confines every member to its domain
itself."""

from __future__ import annotations

from scheduler.filters.chain import verdict
from scheduler.groups.domains import Domain, floor

NAME = "gather_floor"

__all__ = ["Floor", "floor"]


class Floor:
    """The gather floor for a member of ``spec``'s group (``spec``: the group's own spec, with its
    ``gather``), whose members carry Instance.group == ``group``."""

    name = NAME

    def __init__(self, spec, group: str) -> None:
        self.spec, self.group = spec, group

    def domain(self, ctx) -> Domain | None:
        return floor(ctx.snapshot, self.spec, self.group)

    def applies(self, ctx) -> bool:
        return self.domain(ctx) is not None

    def run(self, ctx, workers):
        d = self.domain(ctx)
        inside = set(d.workers) if d else {w.name for w in workers}
        removed = {w.name: [f"outside {d.describe()}, where the group's prefill and decode members are "
                            f"(gather MustGather at {d.layer.name}: refused rather than placed outside it)"]
                   for w in workers if w.name not in inside}
        note = f"Kept {len(workers) - len(removed)}/{len(workers)} workers inside {d.describe()}." if removed else None
        return verdict(NAME, workers, removed, note)
