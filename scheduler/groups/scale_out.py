"""One more member of a formed group's role, placed alone, as GPUStack 2.3.0 places a scaled-out
prefill or decode (scheduler.py find_candidate for a member with a group): the ordinary decision
for the role's effective spec (``role_spec``: filters, selectors, topology policy, scorers), with

- the PD-mode filter and, under MustGather, the gather floor after the ordinary filters;
- candidates spanning workers narrowed to the tightest inside themselves (proximity.narrow);
- topology proximity (near the group's prefill and decode members) and, for prefill and decode,
  pairing affinity (beside the opposite role) appended to the scale-up chain, pairing last and
  weighted one above everything else on the chain (scorers/pairing.py).

A deployment without roles never comes here: decide() is unchanged. With no member placed yet both
scorers are 0 and the member decides as decide(role_spec) would (tests/test_group_scale.py).
"""

from __future__ import annotations

from scheduler import filters, occupancy, reasons, selectors, topology_policy
from scheduler.candidates import GpuRows
from scheduler.cluster import ClusterSnapshot
from scheduler.decide import scale_up_chain, topology_notes
from scheduler.decision import Context, Decision
from scheduler.groups import domains
from scheduler.groups.roles import role_spec
from scheduler.groups.spec import RoleName
from scheduler.policy_config import PolicyConfig
from scheduler.request import Request
from scheduler.scorers import apply_chain, fragmentation, pairing, pick, proximity
from scheduler.spec import ModelSpec


def scale_out(snapshot: ClusterSnapshot, spec: ModelSpec, role: RoleName, request: Request, group: str,
              config: PolicyConfig | None = None) -> Decision:
    """Where one more ``role`` member of ``spec``'s group goes, and why. ``group``: the deployment
    name its members carry (Instance.group); ``request``: the role's request (the router's: its RAM)."""
    role = RoleName(role)
    rspec = role_spec(spec, role)
    occ = occupancy.of(snapshot)
    config = config or PolicyConfig()
    ctx = Context(rspec, snapshot, request, config, occ.allocatable_with(config.foreign_memory_margin), None, occ)
    workers, verdicts = filters.run_chain(ctx, list(snapshot.workers), filters.member_chain(spec, role, group))
    if not workers:
        return Decision(False, None, None, [], verdicts, *reasons.rank(verdicts))
    msgs: list[str] = []
    strategy, cands = selectors.select(ctx, workers, msgs)
    if not cands:
        return Decision(False, None, None, [], verdicts, *reasons.rank(verdicts, msgs))
    cands, refused = topology_policy.keep(snapshot, rspec.topology_policy, cands)
    if not cands:
        return Decision(False, None, strategy, [], verdicts, *reasons.rank(verdicts, refused))
    g = _Group(snapshot, group, role)
    cands = proximity.narrow(cands, g.where, g.tightest)
    flags = None if isinstance(cands, GpuRows) else fragmentation.flags(cands, ctx.occupancy.workers)
    apply_chain(cands, g.chain(scale_up_chain(ctx, flags), cands))
    best = pick(cands)
    placed = reasons.rank(verdicts, scheduled=True)[0]
    return Decision(True, best, strategy, cands, verdicts, placed + g.notes() + topology_notes(ctx, cands, best))


class _Group:
    """What the group's members say about where the new one goes: the layers and each host's
    place in them, the anchors (prefill and decode members' workers), the opposite role's counts."""

    def __init__(self, snapshot: ClusterSnapshot, group: str, role: RoleName) -> None:
        self.role = role
        self.layers = domains.active_layers(snapshot)
        self.tightest = len(self.layers)
        self.where = domains.paths(snapshot.workers, self.layers)
        self.anchors = domains.anchors(snapshot, group)
        self.counts = pairing.opposite_counts(snapshot.instances, group, role)
        self.w = 0.0

    def chain(self, base: list, cands) -> list:
        """``base`` with proximity (when an anchor is placed) and pairing (when an opposite member
        is), pairing weighted one above the rest's ceilings (each scorer's weight is its ceiling)."""
        near = proximity.nears(cands, self.anchors, self.where) if self.anchors else [0] * len(cands)
        out = list(base)
        prox_w = proximity.STEP * self.tightest
        if any(near):
            out.append(("proximity", prox_w, lambda cs: proximity.scores(near, self.tightest)))
        peak = max(self.counts.values(), default=0)
        if self.role in pairing.OPPOSITE and peak:
            self.w = pairing.weight(sum(max(w, 0.0) for _, w, _ in base) + prox_w)
            out.append(("pairing", self.w * peak, lambda cs: pairing.scores(cs, self.counts)))
        return out

    def notes(self) -> list[str]:
        names = "/".join(x.name for x in self.layers)
        out = []
        if self.anchors:
            out.append(f"proximity: {proximity.STEP:g} points per layer ({names}) shared with the group's "
                       f"members on {', '.join(self.anchors)}")
        if self.w:
            opposite = pairing.OPPOSITE[self.role].value
            held = ", ".join(f"{w} {n}" for w, n in self.counts.items())
            out.append(f"pairing: {self.w:g} points per {opposite} beside the new {self.role.value} "
                       f"({opposite}s per worker: {held})")
        return out

