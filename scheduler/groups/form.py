"""A prefill/decode group's formation: every member at once, in the tightest topology domain that
holds them all, or nothing (GPUStack 2.3.0's solve_group_placement, scheduler/group_solver.py, with
group_capacity.py and group_schedule.py). Pure: snapshot, spec and the roles' requests in, a
GroupDecision out.

The walk, layer by layer from the host up the chain (groups/domains.py):
- The domains of a layer are tried smallest first: each sized by how many members of the hungriest
  role (most GPUs a member, then the role's name) its workers hold with nothing placed, ties by
  address; a domain holding none is skipped unless every one of the layer's is. A layer whose
  domains hold the group wins outright, a looser one is never weighed against it; among its
  fitting domains (the first 16) the best by pair and file locality wins (groups/deal.py rank).
- Inside a domain the roles go hungriest first. A worker's slots for a role are how many members
  ``decide()`` places on it one after another (each booked on a dry-run snapshot), for the role's
  effective spec (``role_spec``) and request, through the member chain (every ordinary filter, then
  the PD-mode filter), so the selectors, scorers and per-worker reasons are the ordinary ones. The
  members are dealt round the workers (deal.share_out), one GPU size a role (deal.one_size); a
  role no single worker holds one member of may span workers, where its spec allows that.
- MustGather stops at its layer: nothing there holds the group, and it is refused, the layer
  named. PreferGather and no gather go on to the whole cluster, and gather_unmet is reported when
  the members share a looser layer than the one asked for.
- The router books no GPU, only RAM (``router_ram``), and is placed last, beside the gang: under
  MustGather inside the domain, otherwise anywhere in the cluster, nearest the members first (150
  points a shared layer, over the placement scorer's 100), so inside the domain whenever it fits.
Not scheduled: the reasons name the role that does not fit, where it came closest, and that role's
hosts' reasons (its Decision there); no member is returned."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count

from scheduler import filters, occupancy, reasons
from scheduler.cluster import ClusterSnapshot
from scheduler.decide import decide, scale_up_chain
from scheduler.decision import Candidate, Context, Decision, claim
from scheduler.dry_run import book
from scheduler.groups import deal, domains
from scheduler.groups.decision import GATHER_UNMET, GroupDecision, Member
from scheduler.groups.domains import Domain
from scheduler.groups.layers import chain
from scheduler.groups.roles import role_spec
from scheduler.groups.spec import GatherStrategy, RoleName, router_ram
from scheduler.policy_config import PolicyConfig
from scheduler.request import FlatRequest, Request
from scheduler.scorers import apply_chain, locality, pick
from scheduler.spec import ModelSpec
from scheduler.units import gib

CANDIDATE_LIMIT = 16  # fitting domains of one layer ranked (GPUStack's SCHEDULER_GROUP_CANDIDATE_LIMIT)
STEP = 150.0  # the router's points per layer shared with a member (SCHEDULER_TOPOLOGY_PROXIMITY_MAX_SCORE)


@dataclass
class _Role:
    name: RoleName
    spec: ModelSpec  # its effective spec
    request: Request
    replicas: int
    chain: tuple  # filters.member_chain
    weight: int  # GPUs a member: the hungriest role is dealt first
    eligible: set[str] = field(default_factory=set)  # the workers its chain keeps


@dataclass
class _Fit:
    domain: Domain
    members: list[Member]
    placed: deal.Placed


@dataclass
class _Miss:
    domain: Domain
    role: RoleName
    needed: int
    available: int  # members placed before it plus its slots: where it came closest
    snap: ClusterSnapshot  # the bookings before the role that did not fit
    held: int | None = None  # one_size narrowed the role: the members its band holds
    router: Decision | None = None  # the router's decision, when the router is what does not fit


def _touches(i, keep: set[str]) -> bool:
    return i.worker in keep or any(s.worker in keep for s in i.subordinates)


class _Solve:
    def __init__(self, snapshot: ClusterSnapshot, spec: ModelSpec, requests: dict, config: PolicyConfig | None):
        self.snapshot, self.spec, self.config = snapshot, spec, config or PolicyConfig()
        self.workers = [w for w in snapshot.workers if w.cluster == spec.cluster]
        self.order = {w.name: k for k, w in enumerate(snapshot.workers)}
        self.sizes = {w.name: max(g.vram_total for g in w.gpus) for w in self.workers if w.gpus}
        self.warm = locality.ready_on(snapshot.model_files, spec.source.key)
        self.layers = domains.active_layers(snapshot, self.workers)
        self.where = domains.paths(self.workers, self.layers)
        g = spec.gather
        self.must = bool(g and g.strategy == GatherStrategy.MUST_GATHER and g.layer)
        roles = [self._role(RoleName(r.name), requests) for r in spec.roles or []]
        self.gang = sorted([r for r in roles if r.name != RoleName.ROUTER], key=lambda r: (-r.weight, r.name.value))
        self.router = next((r for r in roles if r.name == RoleName.ROUTER), None)
        self.needed = sum(r.replicas for r in self.gang)
        self.cache: dict[tuple, list[Decision]] = {}
        self.ids = count()
        self.base = len(snapshot.instances)  # every snapshot of this solve is this one plus what it booked
        self.held_on: dict[str, list[int]] = {}  # worker -> the snapshot's instances holding it (by position)
        for k, i in enumerate(snapshot.instances):
            for w in {i.worker, *(s.worker for s in i.subordinates)} - {None}:
                self.held_on.setdefault(w, []).append(k)

    def _only(self, snap: ClusterSnapshot, names) -> ClusterSnapshot:
        """``snap`` (this solve's snapshot plus its own bookings) narrowed to the workers ``names``
        and the instances holding any of them: a decision there reads nothing else, and probing
        one worker costs what that worker holds, not the whole cluster (found by bench/bench_groups.py:
        formation probes every worker of a domain)."""
        keep = set(names)
        held = sorted({k for w in keep for k in self.held_on.get(w, ())})
        mine = [i for i in snap.instances[self.base:] if _touches(i, keep)]
        return snap.model_copy(update={"workers": [w for w in snap.workers if w.name in keep],
                                       "instances": [snap.instances[k] for k in held] + mine})

    def _role(self, name: RoleName, requests: dict) -> _Role:
        rs = role_spec(self.spec, name)
        if name == RoleName.ROUTER:
            req = FlatRequest(vram=0, ram=router_ram(self.spec.roles), basis="a router holds no weights: RAM only")
        elif name in requests:
            req = requests[name]
        else:
            raise ValueError(f"form: no request for role {name.value}")
        role = _Role(name, rs, req, rs.replicas, filters.member_chain(self.spec, name),
                     rs.gpu_selector.gpus_per_replica or 1)
        occ = occupancy.of(self.snapshot)
        alloc = occ.allocatable_with(self.config.foreign_memory_margin)
        ctx = Context(rs, self.snapshot, req, self.config, alloc, None, occ)
        role.eligible = {w.name for w in filters.run_chain(ctx, list(self.workers), role.chain)[0]}
        return role

    def _book(self, snap: ClusterSnapshot, d: Decision, role: RoleName) -> ClusterSnapshot:
        return book(snap, d.placement, f"{self.spec.name}~{role.value}~{next(self.ids)}", self.spec.name)

    def _decide(self, snap: ClusterSnapshot, role: _Role) -> Decision:
        return decide(snap, role.spec, role.request, self.config, chain=role.chain)

    def count(self, role: _Role, w: str, snap: ClusterSnapshot, prior: tuple) -> list[Decision]:
        """The members of ``role`` that ``w`` takes one after another (at most the role's replicas),
        each a decision on ``snap`` narrowed to ``w``; ``prior`` names what this solve booked there."""
        key = (role.name, w, prior)
        if key not in self.cache:
            out: list[Decision] = []
            s = self._only(snap, [w])
            while w in role.eligible and len(out) < role.replicas:
                d = self._decide(s, role)
                if not d.scheduled:
                    break
                out.append(d)
                s = self._book(s, d, role.name)
            self.cache[key] = out
        return self.cache[key]

    def _spanning(self, role: _Role, domain: Domain, snap: ClusterSnapshot) -> dict[str, list[Decision]]:
        """No worker of ``domain`` holds one member alone: members spanning workers (a multi-worker
        placement where the spec allows it), of one GPU size, keyed by their main worker."""
        usable = [w for w in domain.workers if w in role.eligible]
        bs = deal.bands({w: self.sizes[w] for w in usable if w in self.sizes}, self.order)
        if len(bs) > 1:
            usable = min(bs, key=lambda b: (-max(self.sizes[w] for w in b), min(self.order[w] for w in b)))
        out: dict[str, list[Decision]] = {}
        s = self._only(snap, usable)
        while len(usable) > 1 and sum(map(len, out.values())) < role.replicas:
            d = self._decide(s, role)
            if not d.scheduled:
                break
            out.setdefault(d.placement.worker, []).append(d)
            s = self._book(s, d, role.name)
        return out

    def fit(self, domain: Domain) -> _Fit | _Miss:
        """Every gang member inside ``domain``, then the router beside them; or where it stopped."""
        snap, prior, load, done = self.snapshot, {}, {}, 0
        members: list[Member] = []
        placed = deal.Placed()
        for role in self.gang:
            counted = {w: self.count(role, w, snap, prior.get(w, ())) for w in domain.workers}
            sizes = {w: self.sizes[w] for w in domain.workers if w in role.eligible and w in self.sizes}
            slots, held = deal.one_size({w: len(ds) for w, ds in counted.items()}, sizes, self.order)
            share = deal.share_out(slots, role.replicas, load, self.warm, self.order)
            spans = share is None and not any(slots.values())
            if spans:
                counted = self._spanning(role, domain, snap)
                share = deal.share_out({w: len(counted.get(w, [])) for w in domain.workers}, role.replicas,
                                       load, self.warm, self.order)
            if share is None:
                return _Miss(domain, role.name, self.needed, done + sum(slots.values()), snap, held)
            for w, k in share:
                for i, d in enumerate(counted[w][:k]):
                    snap = self._book(snap, d, role.name)
                    members.append(Member(role.name, len(placed.spans) - done, d))
                    placed.spans.append((role.name, d.placement.workers))
                    load[w] = load.get(w, 0) + 1
                    tag = (next(self.ids),) if spans else (role.name, i)
                    for x in d.placement.workers:
                        prior[x] = prior.get(x, ()) + (tag,)
            done += role.replicas
        if self.router is None:
            return _Fit(domain, members, placed)
        scope = domain.workers if self.must else [w.name for w in self.workers]
        d = self._router(snap, scope, [w for _, ws in placed.spans for w in ws])
        if not d.scheduled:
            return _Miss(domain, RoleName.ROUTER, self.needed, done, snap, router=d)
        return _Fit(domain, [*members, Member(RoleName.ROUTER, 0, d)], placed)

    def _router(self, snap: ClusterSnapshot, scope, hosts: list[str]) -> Decision:
        """The router on ``scope``: RAM only, through its member chain, nearest the members first."""
        role = self.router
        sub = self._only(snap, scope)
        occ = occupancy.of(sub)
        ctx = Context(role.spec, sub, role.request, self.config, occ.allocatable, None, occ)
        kept, verdicts = filters.run_chain(ctx, list(sub.workers), role.chain)
        if not kept:
            return Decision(False, None, None, [], verdicts, *reasons.rank(verdicts))
        ram = role.request.ram
        msgs = [f"The router holds no weights and books no GPU: {gib(ram)} GiB of RAM."]
        cands = [Candidate(w.name, [], claim(ram=ram)) for w in kept if ram <= occ.allocatable[w.name].ram]
        if not cands:
            msgs.append(f"No worker has {gib(ram)} GiB of allocatable RAM for the router.")
            return Decision(False, None, None, [], verdicts, *reasons.rank(verdicts, msgs))
        tight = len(self.layers)
        near = self._nearness([c.worker for c in cands], hosts)
        apply_chain(cands, [*scale_up_chain(ctx)[:1],
                            ("proximity", STEP * tight, lambda cs: [100.0 * n / tight for n in near])])
        return Decision(True, pick(cands), "cpu", cands, verdicts, reasons.rank(verdicts, scheduled=True)[0] + msgs)

    def _nearness(self, workers: list[str], hosts: list[str]) -> list[int]:
        """For each of ``workers``, the most layers it shares with one of ``hosts``: the same as
        the largest ``domains.depth`` of it and a host, read from the hosts' path prefixes once
        (one set a layer) rather than for every pair."""
        prefixes = [{self.where[h][:k + 1] for h in hosts if h in self.where} for k in range(len(self.layers))]
        out = []
        for w in workers:
            p = self.where.get(w, ())
            out.append(max((k + 1 for k in range(len(p)) if p[k] is not None and p[:k + 1] in prefixes[k]), default=0))
        return out

    def layer(self, fits: list[_Fit], domains_: list[Domain], sizing: dict[str, int], best: _Miss | None):
        """Try ``domains_`` (one layer's) smallest first; the fits (at most CANDIDATE_LIMIT) and the
        closest miss so far (a tie goes to the later, wider one)."""
        sized = [(sum(sizing.get(w, 0) for w in d.workers), d.address, k) for k, d in enumerate(domains_)]
        viable = [t for t in sized if t[0]] or sized
        for _, _, k in sorted(viable):
            d = domains_[k]
            r = self.fit(d)
            if isinstance(r, _Fit):
                fits.append(r)
                if len(fits) >= CANDIDATE_LIMIT:
                    break
            elif best is None or r.available >= best.available:
                best = r
        return best

    def blocked(self, miss: _Miss) -> Decision | None:
        """Where the group came closest, the role's decision for one member past what fit: its
        hosts' reasons (None: each fits alone, and only the GPU-size rule stopped it)."""
        if miss.router is not None:
            return miss.router
        role = next(r for r in self.gang if r.name == miss.role)
        s = self._only(miss.snap, miss.domain.workers)
        for _ in range(role.replicas + 1):
            d = self._decide(s, role)
            if not d.scheduled:
                return d
            s = self._book(s, d, role.name)
        return None


def form(snapshot: ClusterSnapshot, spec: ModelSpec, requests: dict[RoleName, Request],
         config: PolicyConfig | None = None) -> GroupDecision:
    """Where every member of ``spec``'s group goes, or why the group does not fit. ``requests``: each
    prefill and decode role's request (the router's is its RAM, ``router_ram``)."""
    s = _Solve(snapshot, spec, requests, config)
    if not s.gang:
        return GroupDecision(False, reasons=["The group has no prefill or decode role: nothing to gather."])
    scopes = domains.scopes(s.workers, s.layers)
    ceiling = len(scopes)
    if s.must:
        ids = [x.id for x, _ in scopes]
        if spec.gather.layer not in ids:
            return _no_layer(snapshot, spec)
        ceiling = ids.index(spec.gather.layer) + 1
    sizing = {w.name: len(s.count(s.gang[0], w.name, snapshot, ())) for w in s.workers}
    best = None
    for _, doms in scopes[:ceiling]:
        fits: list[_Fit] = []
        best = s.layer(fits, doms, sizing, best)
        if fits:
            return _decided(s, fits)
    if not s.must:
        r = s.fit(Domain(None, (), tuple(w.name for w in s.workers)))
        if isinstance(r, _Fit):
            return _decided(s, [r])
        best = r if best is None or r.available >= best.available else best
    return _refused(s, best)


def _decided(s: _Solve, fits: list[_Fit]) -> GroupDecision:
    k, terms = deal.rank(fits, lambda f: f.placed, s.warm)
    f = fits[k]
    d = f.domain
    counts = ", ".join(f"{len([m for m in f.members if m.role == r])} {r.value}" for r in RoleName
                       if any(m.role == r for m in f.members))
    notes = [f"The group ({counts}) is gathered in {d.describe()}."]
    degradations = []
    g = s.spec.gather
    if g and g.layer:
        shared = domains.depth(s.where, [w for _, ws in f.placed.spans for w in ws])
        if domains.looser(s.snapshot, s.layers, shared, g.layer):
            degradations.append(GATHER_UNMET)
            wanted = next(x.name for x in chain(s.snapshot.topology) if x.id == g.layer)
            notes.append(f"{GATHER_UNMET}: {g.strategy.value} asked for one {wanted}; the prefill and decode "
                         f"members share {('one ' + s.layers[shared - 1].name) if shared else 'only the cluster'}.")
    return GroupDecision(True, f.members, (d.layer.id, d.name) if d.layer else None, degradations, notes,
                         d.address, terms=terms)


def _refused(s: _Solve, best: _Miss | None) -> GroupDecision:
    if best is None:  # no domain to try: a MustGather layer without a host, or no worker at all
        best = _Miss(Domain(None, (), tuple(w.name for w in s.workers)), s.gang[0].name, s.needed, 0, s.snapshot)
    role = best.role
    blocked = s.blocked(best)
    if best.router is not None:
        scope = best.domain.describe() if s.must else "the cluster"
        head = (f"The group's prefill and decode members fit in {best.domain.describe()}, but nothing in {scope} "
                "has room for its router.")
    elif s.must:
        layer = next(x for x in s.layers if x.id == s.spec.gather.layer)
        head = (f"The group needs {best.needed} placements in one {layer.name} ({layer.id}, MustGather), and the "
                f"roomiest ({best.domain.describe()}) holds {best.available}: {role.value} does not fit there.")
    else:
        head = (f"The group needs {best.needed} placements and the cluster has room for {best.available}: "
                f"{role.value} does not fit.")
    out = [head]
    replicas = next((r.replicas for r in s.gang if r.name == role), 0)
    if best.held is not None and best.held < replicas:
        out.append(f"{role.value}: its members sit on GPUs of one size; the largest such set holds {best.held} of "
                   f"the {replicas} it needs.")
    out += [f"{role.value}: {r}" for r in (blocked.reasons if blocked else [])]
    return GroupDecision(False, reasons=out, role=role, blocked=blocked)


def _no_layer(snapshot: ClusterSnapshot, spec: ModelSpec) -> GroupDecision:
    lid = spec.gather.layer
    x = next((x for x in chain(snapshot.topology) if x.id == lid), None)
    if x is None:
        why = f"gather MustGather at {lid}: the cluster declares no such layer; the group is refused."
    else:
        why = (f"gather MustGather at {x.name} ({lid}): no host carries any of its labels "
               f"({', '.join(x.label_keys)}), so no {x.name} can hold the group; it is refused rather than spread.")
    return GroupDecision(False, reasons=[why])
