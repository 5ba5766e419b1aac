"""A prefill/decode group placed on a control-plane worker (issue 41), the blocking part of the
group activities (activities/group_activities.py): under the Decider's lock, the fresh snapshot,
the pure policy (scheduler/groups/: ``form`` for a formation, ``scale_out`` for one more member),
the tenant's limits counted over every member at once, and the booking of every member in one
ledger transaction (ledger.reserve_group), or nothing. Each member's decision is the record the
instance workflow carries (contracts/decision_of.py ``decision_record``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from activities import tenancy
from activities.decider import Decider
from activities.decision_keeper import keep_group_decision
from contracts.decision import PlacementPlan
from contracts.decision_of import decision_record, plan_of
from contracts.group import GroupPlaced, MemberPlaced
from scheduler.cluster import ClusterSnapshot
from scheduler.decision import Decision
from scheduler.group_inputs import FORMATION, SCALE_OUT, GroupInputs
from scheduler.groups.decision import GroupDecision
from scheduler.groups.form import form
from scheduler.groups.roles import role_spec
from scheduler.groups.scale_out import scale_out
from scheduler.groups.spec import RoleName
from scheduler.request import Request
from scheduler.spec import ModelSpec
from scheduler.summary import request_summary, summary_text
from scheduler.tenancy.admission import over_limit
from scheduler.tenancy.admit import may_preempt
from scheduler.tenancy.config import DEFAULT
from scheduler.tenancy.usage import Usage, by_tenant, of_candidate
from scheduler.tenancy.group_preempt import plan_group
from store import group_ledger, ledger

TRIES = 3  # formations while the ledger refuses the plans (the capacity moved under another worker)


@dataclass(frozen=True)
class Placed:
    """One member the policy placed: its name, role, decision and request."""

    name: str
    role: RoleName
    decision: Decision
    request: Request


def group_quota(snap: ClusterSnapshot, spec: ModelSpec, who, members: list[Placed]) -> str | None:
    """The tenant's limit the whole group would break (every member counted at once, none of them
    counted as used), or None."""
    tf, owners = who
    mine = owners.tenant_of.get(spec.name, "default")
    me = tf.get(mine) or DEFAULT
    if not me.limit.named():
        return None
    names = {m.name for m in members}
    used = by_tenant([i for i in snap.instances if owners.tenant_of.get(i.model, "default") == mine
                      and i.name not in names], owners.tenant_of).get(mine, Usage())
    need = Usage()
    for m in members:
        need = need + of_candidate(m.decision.placement)
    q = over_limit(me, used, need)
    return q.replace("this replica needs", f"this group of {len(members)} needs") if q else None


@dataclass
class Choice:
    """What a chooser made of the snapshot: the members placed (None: not placed, and why), the
    formation's degradations, and the victims it takes (name -> what each holds) and why."""

    placed: list[Placed] | None
    role: RoleName | None = None
    reasons: list[str] = field(default_factory=list)
    degradations: list[str] = field(default_factory=list)
    victims: dict[str, PlacementPlan] = field(default_factory=dict)
    why: str = ""
    kept: tuple[GroupInputs, GroupDecision | Decision] | None = None  # what the policy saw and said (explain --replay)


def book(decider: Decider, spec: ModelSpec, group: str, choose, who) -> GroupPlaced:
    """``choose(snapshot, who)`` -> a Choice, under the decision lock on the fresh snapshot; the
    tenant's limits over every member; then every member booked in one transaction (taking the
    victims' lines in the same one), or nothing. A plan the ledger refuses is chosen again, TRIES times."""
    miss = Choice(None, reasons=["the capacity moved under every try"])
    for _ in range(TRIES):
        decider.snapshots.sync(decider.reads)
        with decider.deciding:
            snap, _, gens = decider.snapshots.current()
            ch: Choice = choose(snap, who)
            if ch.placed is None:
                keep_group_decision(decider.keeper, ch.kept, gens)
                return GroupPlaced(scheduled=False, role=ch.role, reasons=ch.reasons)
            quota = None if ch.victims else group_quota(snap, spec, who, ch.placed)
            if quota:
                return GroupPlaced(scheduled=False, reasons=[quota])
            tenant = who[1].tenant_of.get(spec.name, "default")
            recs = [(p, _record(p, len(snap.workers), gens, tenant)) for p in ch.placed]
            keep_group_decision(decider.keeper, ch.kept, gens, {p.name: r for p, r in recs})
            books = [ledger.Booking(p.name, r.plan, f"{r.strategy}: score {r.score}", r.booked_row(_summary(p.request)),
                                    "scheduled", role_spec(spec, p.role).backend.value) for p, r in recs]
            got = group_ledger.preempt_group(decider.engine, books, ch.victims, f"preempted by {tenant}/{group} {ch.why}")\
                if ch.victims else ledger.reserve_group(decider.engine, books)
            if isinstance(got, ledger.NotWanted):
                raise got
            if isinstance(got, ledger.StaleDecision):
                decider.metrics.conflicts.labels("rejected").inc()
                miss = Choice(None, reasons=[str(got)])
                continue
            for p, r in recs:
                decider.snapshots.assume(p.name, spec.name, r.plan, role=p.role.value, group=group)
            return GroupPlaced(scheduled=True, degradations=ch.degradations, tenant=tenant, victims=sorted(ch.victims),
                               preempt_why=ch.why, members=[MemberPlaced(name=p.name, role=p.role, plan=r.plan,
                                                                          decision=r) for p, r in recs])
    return GroupPlaced(scheduled=False, role=miss.role, reasons=miss.reasons)


def formation(spec: ModelSpec, names: dict[RoleName, list[str]], requests: dict[RoleName, Request], policy):
    """The chooser of a formation: ``form`` on the snapshot, its members named in role order; when
    the group does not form and its tenant may preempt, the fewest victims that let it form whole
    (scheduler/tenancy/group_preempt.py), or none."""
    placed_roles = {r: q for r, q in requests.items() if r != RoleName.ROUTER}
    mine = {n for ns in names.values() for n in ns}

    def members(g) -> list[Placed]:
        return [Placed(names[m.role][m.ordinal], m.role, m.decision, requests[m.role]) for m in g.members]

    def choose(snap: ClusterSnapshot, who) -> Choice:
        inp = GroupInputs(FORMATION, snap, spec, spec.name, names, requests, who[0], who[1], policy, {})
        g = form(snap, spec, placed_roles, policy)
        if g.scheduled:
            return Choice(members(g), degradations=list(g.degradations), kept=(inp, g))
        if not may_preempt(spec, who[0], who[1]):
            return Choice(None, g.role, list(g.reasons), kept=(inp, g))
        p = plan_group(snap, spec, placed_roles, who[0], who[1], mine, policy)
        if p.group is None or not p.group.scheduled:
            return Choice(None, g.role, list(g.reasons) + p.reasons, kept=(inp, g))
        held = {i.name: plan_of(i) for i in snap.instances if i.name in p.victims}
        return Choice(members(p.group), degradations=list(p.group.degradations),
                      victims={v: held[v] for v in p.victims}, why=p.why, kept=(inp, p.group))
    return choose


def one_more(spec: ModelSpec, group: str, name: str, role: RoleName, request: Request, policy):
    """The chooser of one more member of ``role``, placed alone (``scale_out``)."""
    def choose(snap: ClusterSnapshot, who) -> Choice:
        d = scale_out(snap, spec, role, request, group, policy)
        kept = (GroupInputs(SCALE_OUT, snap, spec, group, {role: [name]}, {role: request}, who[0], who[1], policy, {}), d)
        if not d.scheduled:
            return Choice(None, role, [f"role {role.value}: no host fits one more member", *d.reasons], kept=kept)
        return Choice([Placed(name, role, d, request)], kept=kept)
    return choose


def _summary(req: Request) -> str:
    return summary_text(request_summary(req))


def _record(p: Placed, workers: int, gens: dict[str, int], tenant: str):
    rec = decision_record(p.decision, p.request, workers, gens)
    rec.tenant = tenant
    return rec
