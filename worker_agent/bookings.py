"""The booking check, on the agent's side: before it starts any process for an instance, the agent
asks the control plane which of this host's GPUs the reservation ledger booked for that instance,
and starts nothing the ledger does not hold. A placement in a workflow's input or in a launch
request is never trusted on its own: anyone who can start a workflow or an activity through
Temporal can write one.

A seam with one method (STYLE.md §5): :class:`LedgerBookings` asks the host's own workflow
(``host/<worker>``, update ``booking``; its handler reads the ledger); :class:`HeldBookings` is
an in-memory ledger for the agent's unit tests."""

from __future__ import annotations

from typing import Protocol

from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError

from contracts.ids import host_id
from contracts.host import BOOKING_UPDATE, Booking, BookingQuery


class BookingUnknown(Exception):
    """The control plane could not be asked (it did not answer): nothing is started, and the launch
    is tried again later."""


class Bookings(Protocol):
    async def booked(self, instance: str) -> Booking:
        """The ledger's booking for ``instance`` on this host (raises BookingUnknown when it cannot say)."""
        ...


class LedgerBookings:
    """Asks the host workflow, which reads the ledger (workflows/host.py, activities/booking.py)."""

    def __init__(self, client: Client, host: str):
        self.client, self.host = client, host

    async def booked(self, instance: str) -> Booking:
        handle = self.client.get_workflow_handle(host_id(self.host))
        try:
            return await handle.execute_update(BOOKING_UPDATE, BookingQuery(instance=instance), result_type=Booking)
        except (RPCError, WorkflowUpdateFailedError) as e:
            raise BookingUnknown(f"cannot ask the control plane for the booking of {instance} on {self.host}: "
                                 f"{getattr(e, 'cause', None) or e}") from None


class HeldBookings:
    """An in-memory ledger: instance -> the GPU indexes booked on this host (``[]``: CPU only)."""

    def __init__(self, held: dict[str, list[int]] | None = None):
        self.held = dict(held or {})

    async def booked(self, instance: str) -> Booking:
        if instance not in self.held:
            return Booking()
        return Booking(booked=True, gpu_indexes=sorted(self.held[instance]))


def refusal(instance: str, host: str, gpus: list[int], booking: Booking) -> str | None:
    """Why a launch of ``instance`` on ``gpus`` of ``host`` is refused given the ledger's ``booking``
    (None: it may start)."""
    if not booking.booked:
        return (f"no booking in the ledger for instance {instance} on host {host}: an instance launches only "
                "what the control plane booked for it (start it through its deployment)")
    extra = sorted(set(gpus) - set(booking.gpu_indexes))
    if extra:
        return (f"instance {instance} asks for GPU(s) {', '.join(map(str, extra))} of host {host}, which the ledger "
                f"did not book for it (booked: {', '.join(map(str, booking.gpu_indexes)) or 'none'})")
    return None
