"""The ledger's reads for the booking check (no engine runs without its booking): what a host may
run for an instance, and whether a placement is the one the ledger holds. The host workflow runs
them as local activities for its agent (activities/booking.py); the instance workflow asks the
second before it trusts a placement carried across continue-as-new."""

from __future__ import annotations

from pydantic import ValidationError
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from contracts.booked_parts import booked_parts
from contracts.control import PlacementPlan
from contracts.host import Booking, HostBookings
from store.ledger import held_rows, same_rows, plan_rows
from store.wanted import unwanted
from store.tables import InstanceRow, ReservationRow


def booking_on(engine: Engine, instance: str, worker: str) -> Booking:
    """What an agent may start for ``instance`` on ``worker`` (the booking check, contracts/host.py)."""
    return bookings_on(engine, [instance], worker)[instance]


def bookings_on(engine: Engine, instances: list[str], worker: str) -> dict[str, Booking]:
    """The booking on ``worker`` of each of ``instances``, from its ledger lines there and its stored
    placement: the GPUs the lines book, the processes (parts) the placement runs there
    (contracts/booked_parts.py), and the claim of its server there (the main worker's lines). An
    instance without a line there, or not one its deployment wants (``unwanted``), is not booked,
    with the reason. One read for all (the orphan check asks once per check)."""
    r, t = ReservationRow.__table__, InstanceRow.__table__
    names = sorted(set(instances))
    with Session(engine) as s:
        c = s.connection()
        lines = list(c.execute(select(r.c.instance, r.c.gpu_index, r.c.vram, r.c.ram, r.c.role)
                               .where(r.c.worker == worker, r.c.instance.in_(names))))
        rows = {x.name: x for x in c.execute(select(t.c.name, t.c.deployment, t.c.state, t.c.wanted, t.c.placement,
                                                    t.c.backend).where(t.c.name.in_(names)))}
    return {n: _booking_of(n, worker, [x for x in lines if x.instance == n], rows.get(n)) for n in names}


def host_bookings(engine: Engine, instances: list[str], worker: str) -> HostBookings:
    """Those of ``instances`` booked on ``worker``, with their bookings (the orphan check's read)."""
    return HostBookings(bookings={n: b for n, b in bookings_on(engine, instances, worker).items() if b.booked})


def _booking_of(instance: str, worker: str, lines: list, row) -> Booking:
    if not lines:
        return Booking(reason=f"no booking in the ledger for instance {instance} on host {worker}")
    why = unwanted(instance, row)
    if why:
        return Booking(reason=why)
    try:
        plan = PlacementPlan.model_validate(row.placement)
    except ValidationError as e:
        return Booking(reason=f"instance {instance}'s stored placement does not validate: {e.errors()[0]['msg']}")
    return _booked(lines, plan, row.backend, worker)


def booked_by(instance: str, worker: str, plan: PlacementPlan, backend: str | None) -> Booking:
    """The Booking on ``worker`` of a plan the ledger has just booked for ``instance`` (a wanted
    replica: the booking's transaction checked it), as ``bookings_on`` would read it back: its
    lines are the plan's (ledger.plan_rows)."""
    return _booked([x for x in plan_rows(instance, plan) if x.worker == worker], plan, backend, worker)


def _booked(lines: list, plan: PlacementPlan, backend: str | None, worker: str) -> Booking:
    main = [x for x in lines if x.role == "main"]
    return Booking(booked=True, gpu_indexes=sorted({x.gpu_index for x in lines if x.gpu_index >= 0}),
                   parts=booked_parts(backend, plan, worker),
                   vram_claim={x.gpu_index: x.vram for x in main if x.gpu_index >= 0 and x.vram > 0},
                   ram_claim=sum(x.ram for x in main))


def holds_problem(engine: Engine, instance: str, plan: PlacementPlan) -> str | None:
    """Why ``plan`` is not what the ledger holds for ``instance``, a replica its deployment wants
    (None: it is). The instance workflow asks before it trusts a placement carried across
    continue-as-new: anybody's workflow can continue as new into one."""
    with Session(engine) as s:
        t = InstanceRow.__table__
        row = s.connection().execute(select(t.c.deployment, t.c.state, t.c.wanted).where(t.c.name == instance)).first()
        why = unwanted(instance, row)
        held = held_rows(s, instance)
    if why:
        return why
    if not held:
        return f"the ledger holds no booking for instance {instance}"
    if not same_rows(held, plan_rows(instance, plan)):
        return f"the ledger holds another booking for instance {instance} than the placement given"
    return None
