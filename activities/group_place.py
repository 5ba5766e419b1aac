"""A prefill/decode group placed on a control-plane worker (issue 41), the blocking part of the
group activities (activities/group_activities.py): under the Decider's lock, the fresh snapshot,
the pure policy (scheduler/groups/: ``form`` for a formation, ``scale_out`` for one more member),
the tenant's limits counted over every member at once, and the booking of every member in one
ledger transaction (ledger.reserve_group), or nothing. Each member's decision is the record the
instance workflow carries (contracts/decision_of.py ``decision_record``)."""

from __future__ import annotations

from dataclasses import dataclass

from activities import tenancy
from activities.decider import Decider
from contracts.decision_of import decision_record
from contracts.group import GroupPlaced, MemberPlaced
from scheduler.cluster import ClusterSnapshot
from scheduler.decision import Decision
from scheduler.groups.form import form
from scheduler.groups.roles import role_spec
from scheduler.groups.scale_out import scale_out
from scheduler.groups.spec import RoleName
from scheduler.request import Request
from scheduler.spec import ModelSpec
from scheduler.summary import request_summary, summary_text
from scheduler.tenancy.admission import over_limit
from scheduler.tenancy.config import DEFAULT
from scheduler.tenancy.usage import Usage, by_tenant, of_candidate
from store import ledger

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


def book(decider: Decider, spec: ModelSpec, group: str, choose, who) -> GroupPlaced:
    """``choose(snapshot)`` -> (the members placed or None, (role, reasons), degradations) under the decision
    lock, on the fresh snapshot; the tenant's limits over them all; then every member booked in one
    transaction, or nothing. A plan the ledger refuses is chosen again, TRIES times."""
    why: tuple[RoleName | None, list[str]] = (None, ["the capacity moved under every try"])
    for _ in range(TRIES):
        decider.snapshots.sync(decider.reads)
        with decider.deciding:
            snap, _, gens = decider.snapshots.current()
            placed, miss, degraded = choose(snap)
            if placed is None:
                return GroupPlaced(scheduled=False, role=miss[0], reasons=miss[1])
            quota = group_quota(snap, spec, who, placed)
            if quota:
                return GroupPlaced(scheduled=False, reasons=[quota])
            tenant = who[1].tenant_of.get(spec.name, "default")
            recs = [(p, _record(p, len(snap.workers), gens, tenant)) for p in placed]
            got = ledger.reserve_group(decider.engine, [
                ledger.Booking(p.name, r.plan, f"{r.strategy}: score {r.score}", r.booked_row(_summary(p.request)),
                               "scheduled", role_spec(spec, p.role).backend.value) for p, r in recs])
            if isinstance(got, ledger.NotWanted):
                raise got
            if isinstance(got, ledger.StaleDecision):
                decider.metrics.conflicts.labels("rejected").inc()
                why = (None, [str(got)])
                continue
            for p, r in recs:
                decider.snapshots.assume(p.name, spec.name, r.plan, role=p.role.value, group=group)
            return GroupPlaced(scheduled=True, degradations=degraded, members=[
                MemberPlaced(name=p.name, role=p.role, plan=r.plan, decision=r) for p, r in recs])
    return GroupPlaced(scheduled=False, role=why[0], reasons=why[1])


def formation(spec: ModelSpec, names: dict[RoleName, list[str]], requests: dict[RoleName, Request], policy):
    """The chooser of a formation: ``form`` on the snapshot, its members named in role order."""
    placed_roles = {r: q for r, q in requests.items() if r != RoleName.ROUTER}

    def choose(snap: ClusterSnapshot):
        g = form(snap, spec, placed_roles, policy)
        if not g.scheduled:
            return None, (g.role, list(g.reasons)), []
        return ([Placed(names[m.role][m.ordinal], m.role, m.decision, requests[m.role]) for m in g.members], None,
                list(g.degradations))
    return choose


def one_more(spec: ModelSpec, group: str, name: str, role: RoleName, request: Request, policy):
    """The chooser of one more member of ``role``, placed alone (``scale_out``)."""
    def choose(snap: ClusterSnapshot):
        d = scale_out(snap, spec, role, request, group, policy)
        if not d.scheduled:
            return None, (role, [f"role {role.value}: no host fits one more member", *d.reasons]), []
        return [Placed(name, role, d, request)], None, []
    return choose


def _summary(req: Request) -> str:
    return summary_text(request_summary(req))


def _record(p: Placed, workers: int, gens: dict[str, int], tenant: str):
    rec = decision_record(p.decision, p.request, workers, gens)
    rec.tenant = tenant
    return rec
