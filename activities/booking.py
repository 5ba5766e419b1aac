"""The booking check's reads (no engine runs without its booking): what the ledger lets a host run
for an instance (store/bookings.py). The host workflow runs them, as local activities, when the
host's agent asks before it starts a process or when its orphan check asks which of its processes
are booked (workflows/host.py, updates ``booking`` and ``bookings``; contracts/host.py); the
instance workflow runs ``held_plan`` before it trusts a placement carried across continue-as-new."""

from __future__ import annotations

from sqlalchemy.engine import Engine
from temporalio import activity

from activities.runner import Runner
from contracts.activity_names import BOOKING_ON, BOOKINGS_ON, HELD_PLAN
from contracts.host import Booking, BookingAsk, BookingsAsk, HeldAsk, HostBookings
from store import bookings


class BookingActivities:
    def __init__(self, reads: Engine, runner: Runner):
        """``reads``: the read-only engine (db.reader); ``runner``: the worker's pool."""
        self.reads, self.runner = reads, runner

    def all(self) -> list:
        return [self.booking_on, self.bookings_on, self.held_plan]

    @activity.defn(name=BOOKING_ON)
    async def booking_on(self, ask: BookingAsk) -> Booking:
        """The booking of ``ask.instance`` on ``ask.worker``: booked or not (why), its GPUs, parts and claim."""
        return await self.runner.submit(bookings.booking_on, self.reads, ask.instance, ask.worker)

    @activity.defn(name=BOOKINGS_ON)
    async def bookings_on(self, ask: BookingsAsk) -> HostBookings:
        """The bookings on ``ask.worker`` of those of ``ask.instances`` booked there."""
        return await self.runner.submit(bookings.host_bookings, self.reads, ask.instances, ask.worker)

    @activity.defn(name=HELD_PLAN)
    async def held_plan(self, ask: HeldAsk) -> str:
        """"" when the ledger holds exactly ``ask.plan`` for ``ask.instance``, a wanted replica; else why not."""
        return await self.runner.submit(bookings.holds_problem, self.reads, ask.instance, ask.plan) or ""
