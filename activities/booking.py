"""The booking check's read (no engine runs without its booking): which GPUs of a host the ledger
booked for an instance. The host workflow runs it, as a local activity, when the host's agent
asks before it starts a process (workflows/host.py, update ``booking``; contracts/host.py)."""

from __future__ import annotations

from sqlalchemy.engine import Engine
from temporalio import activity

from activities.runner import Runner
from contracts.activity_names import BOOKING_ON
from store import ledger
from contracts.host import Booking, BookingAsk


class BookingActivities:
    def __init__(self, reads: Engine, runner: Runner):
        """``reads``: the read-only engine (db.reader); ``runner``: the worker's pool."""
        self.reads, self.runner = reads, runner

    def all(self) -> list:
        return [self.booking_on]

    @activity.defn(name=BOOKING_ON)
    async def booking_on(self, ask: BookingAsk) -> Booking:
        """The ledger's lines for ``ask.instance`` on ``ask.worker``: booked or not, and the GPUs."""
        booked, gpus = await self.runner.submit(ledger.booking_on, self.reads, ask.instance, ask.worker)
        return Booking(booked=booked, gpu_indexes=gpus)
