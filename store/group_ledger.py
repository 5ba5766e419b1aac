"""A prefill/decode group booked by preemption, whole (issue 41): in ONE transaction, its victims'
ledger lines deleted and every member's booked, or nothing written. The single-replica preemption's
checks (store/ledger.py ``preempt``), over the whole group: under the locks of every worker touched,
each victim still holds exactly what the decision took from it and the tenants' reclaim rules hold
again (reclaim_problem_in, before anything is taken); then, the victims' lines gone, each member is
booked as ``reserve_group`` books it (wanted, fitting on top of the members before it, within its
tenant's limits). The victims' rows keep their state (their processes run until their workflows
stop them) with ``reason`` and no placement."""

from __future__ import annotations

from sqlalchemy import delete
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from contracts.decision import PlacementPlan
from store import tenants
from store.ledger import (Booking, NotWanted, StaleDecision, bump_workers, lock_workers, mark_victims, plan_rows,
                          reserve_in, same_rows)
from store.tables import ReservationRow


def preempt_group(engine: Engine, bookings: list[Booking], victims: dict[str, PlacementPlan],
                  reason: str) -> list[tuple[PlacementPlan, bool]] | StaleDecision | NotWanted:
    """Book every member of ``bookings`` by taking ``victims``' GPUs (name -> what the decision took
    from it), all in one transaction; the first problem rolls everything back and is returned."""
    wanted = [plan_rows(b.instance, b.plan) for b in bookings]
    theirs = {v: plan_rows(v, p) for v, p in victims.items()}
    with Session(engine) as s:
        names = {r.worker for rows in [*wanted, *theirs.values()] for r in rows}
        workers = lock_workers(s, sorted(names))
        out = []
        try:
            for v, rows in sorted(theirs.items()):
                have = list(s.exec(select(ReservationRow).where(ReservationRow.instance == v)))
                if not have or not same_rows(have, rows):
                    raise StaleDecision(f"victim {v} no longer holds what the decision took from it")
            for b, rows in zip(bookings, wanted):
                why = tenants.reclaim_problem_in(s, b.instance, rows, theirs)
                if why:
                    raise StaleDecision(f"instance {b.instance}: {why}")
            s.exec(delete(ReservationRow).where(ReservationRow.instance.in_(set(victims))))
            s.flush()
            for b, rows in zip(bookings, wanted):
                out.append((b.plan, reserve_in(s, workers, b, rows)))
        except (StaleDecision, NotWanted) as e:
            s.rollback()
            return e
        mark_victims(s, victims, reason)
        bump_workers(s, workers.values())
        s.commit()
    return out
