"""A prefill/decode group's rows (issue 41): its members are instance rows like any replica's,
wanted (store/wanted.py), each with its ``role`` and ``group_name`` (the deployment owning the
group). The deployment writes them before the group is formed (activities/group_activities.py),
so the formation's one transaction (ledger.reserve_group) books rows its deployment wants; while
the group cannot be formed they wait PENDING with the reason naming the role that does not fit.
The PENDING queue leaves them out until they are booked (store/pending_queue.py: a booking names
its backend): nobody but their deployment places them, and it retries the whole group on its own
timer (workflows/group_steps.py). A formed member placed again by its own workflow (its host lost)
waits in the queue like any replica, judged there with its deployment's spec."""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from store import changes
from store.records import QUEUED
from store.tables import InstanceRow, utcnow


def create_members(engine: Engine, deployment: str, model: str, members: dict[str, str], gen: int = 0) -> list[str]:
    """The first row of each member (name -> role) in one transaction, wanted, PENDING, with its
    role, group and the group's generation ``gen`` (a prefill and a decode pair only within one); a row written since is left as it is (a retry), a deleted one is a new member's
    first row (as records.create_instances). Returns the names inserted."""
    if not members:
        return []
    with Session(engine) as s:
        have = {r.name: r for r in s.exec(select(InstanceRow).where(InstanceRow.name.in_(list(members))))}
        made = []
        for name, role in members.items():
            row = have.get(name)
            if row is not None and row.state != "deleted":
                continue
            row = row or InstanceRow(name=name, deployment=deployment)
            row.deployment, row.model, row.state, row.reason, row.wanted = deployment, model, "pending", "", True
            row.role, row.group_name, row.decision, row.placement, row.backend = role, deployment, None, None, None
            row.group_gen = gen
            row.queued_at, row.updated_at = utcnow(), utcnow()
            s.add(row)
            changes.bump(s, name)
            made.append(name)
        s.commit()
        return made


def set_waiting(engine: Engine, names: list[str], reason: str) -> int:
    """The members not placed yet (PENDING or ANALYZING) say ``reason``; how many changed."""
    t = InstanceRow.__table__
    with Session(engine) as s:
        n = s.connection().execute(update(t).where(t.c.name.in_(names), t.c.state.in_(QUEUED), t.c.reason != reason).values(reason=reason, updated_at=utcnow())).rowcount
        s.commit()
    return n or 0


def set_failed(engine: Engine, names: list[str], reason: str) -> int:
    """The members not placed yet (PENDING, ANALYZING, or ERROR from a formation before) are ERROR
    with ``reason``: the spec's fault (its model cannot be estimated), as a plain replica gives up;
    a formation that books them later writes their rows anew. How many changed."""
    t = InstanceRow.__table__
    with Session(engine) as s:
        n = s.connection().execute(update(t).where(t.c.name.in_(names), t.c.state.in_((*QUEUED, "error")),
                                                   t.c.reason != reason).values(state="error", reason=reason,
                                                                                updated_at=utcnow())).rowcount
        if n:
            for name in names:
                changes.bump(s, name)
        s.commit()
    return n or 0
