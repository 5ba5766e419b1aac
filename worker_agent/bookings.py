"""The booking check, on the agent's side: before it starts any process for an instance, the agent
asks the control plane what the reservation ledger booked for that instance on this host, and
starts nothing the ledger does not hold. One booking, one set of processes: the booking names
each process (part) its placement needs here (contracts/booked_parts.py), in its role and on its
GPUs; any other part is refused, naming it, and a part that runs already is adopted, never
started twice. A placement in a workflow's input or in a launch request is never trusted on its
own: anyone who can start a workflow or an activity through Temporal can write one.

A seam with one method per read (STYLE.md §5): :class:`LedgerBookings` asks the host's own
workflow (``host/<worker>``, update ``booking``; its handler reads the ledger) and, for the orphan
check, the reads workflow (``cluster-reads``, query ``bookings``: answered from the ledger by a
control-plane worker and written in no history, where the host workflow's ``bookings`` update
cost a workflow task and six events a check; that update is asked only when the query cannot be
answered); :class:`HeldBookings` is an in-memory ledger for the agent's unit tests. Each is asked
only of a run that is the control plane's workflow of that type on its queue
(contracts/control_run.py): a workflow of somebody's own holding the id is never asked, and is
named in the agent's log."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Callable, Protocol

from temporalio.client import Client, WorkflowQueryFailedError, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from contracts import booking_proof
from contracts.agent import instance_of
from contracts.booking_proof import BookingProof
from contracts.control_run import NotControlPlane, control_run
from contracts.ids import CLUSTER_BOOKINGS, CLUSTER_READS_ID, CLUSTER_READS_WORKFLOW, HOST_WORKFLOW, host_id
from contracts.host import (BOOKING_UPDATE, BOOKINGS_UPDATE, MAX_ASKED, BookedPart, Booking, BookingQuery,
                            BookingsAsk, BookingsQuery, HostBookings)


log = logging.getLogger("gpuflow.agent")
READ_WAIT = timedelta(seconds=10)  # the reads workflow's answer, at most (its worker's own deadline is 1.5 s)


class BookingUnknown(Exception):
    """The control plane could not be asked (it did not answer): nothing is started, and the launch
    is tried again later."""


class Bookings(Protocol):
    async def booked(self, instance: str) -> Booking:
        """The ledger's booking for ``instance`` on this host (raises BookingUnknown when it cannot say)."""
        ...

    async def booked_here(self, instances: list[str]) -> dict[str, Booking]:
        """Those of ``instances`` the ledger books on this host, with their bookings (BookingUnknown likewise)."""
        ...


class LedgerBookings:
    """Asks the host workflow, which reads the ledger (workflows/host.py, activities/booking.py)."""

    def __init__(self, client: Client, host: str):
        self.client, self.host = client, host

    async def _ask(self, update: str, arg, result_type, what: str):
        """The host workflow's ``update``, asked of its run once described as the control plane's
        HostWorkflow (a run that ends meanwhile, as it continues as new, is described again once)."""
        for last in (False, True):
            try:
                handle = await control_run(self.client, host_id(self.host), HOST_WORKFLOW)
                return await handle.execute_update(update, arg, result_type=result_type)
            except NotControlPlane as e:
                log.warning("the booking of %s not asked: %s", what, e)
                why = str(e)
            except (RPCError, WorkflowUpdateFailedError) as e:
                if not last and isinstance(e, RPCError) and e.status == RPCStatusCode.NOT_FOUND:
                    continue
                why = str(getattr(e, "cause", None) or e)
            raise BookingUnknown(f"cannot ask the control plane for the booking of {what} on {self.host}: {why}")
        raise AssertionError("unreachable")  # the loop returns or raises

    async def booked(self, instance: str) -> Booking:
        return await self._ask(BOOKING_UPDATE, BookingQuery(instance=instance), Booking, instance)

    async def booked_here(self, instances: list[str]) -> dict[str, Booking]:
        out: dict[str, Booking] = {}
        for i in range(0, len(instances), MAX_ASKED):
            chunk = instances[i:i + MAX_ASKED]
            got = await self._read(chunk)
            if got is None:
                got = await self._ask(BOOKINGS_UPDATE, BookingsQuery(instances=chunk), HostBookings,
                                      f"{len(chunk)} instance(s)")
            out.update(got.bookings)
        return out

    async def _read(self, instances: list[str]) -> HostBookings | None:
        """The reads workflow's answer, or None when it gives none (not started yet, a control plane
        without the query, a store past its read's deadline): then the host workflow is asked. Asked
        only of a run that is the control plane's reads workflow on its queue (so answered by the
        control plane's code, a closed run's too): anyone who can reach Temporal can start a
        workflow of their own with the id ``cluster-reads``, and its answer would be theirs."""
        try:
            handle = await control_run(self.client, CLUSTER_READS_ID, CLUSTER_READS_WORKFLOW, READ_WAIT)
            return await handle.query(CLUSTER_BOOKINGS, BookingsAsk(instances=instances, worker=self.host),
                                      result_type=HostBookings, rpc_timeout=READ_WAIT)
        except NotControlPlane as e:
            log.warning("the ledger's bookings asked of host/%s: %s", self.host, e)
            return None
        except (RPCError, WorkflowQueryFailedError):
            return None


class TakenProofs:
    """The booking proofs this agent took (contracts/booking_proof.py): each once, while fresh.
    A proof's nonce is kept twice its time to live, so it is refused until it would be anyway."""

    def __init__(self, clock: Callable[[], float] = time.time):
        self.clock = clock
        self.taken: dict[str, float] = {}  # nonce -> when it was taken

    def booking(self, key: bytes, proof: BookingProof, instance: str, host: str) -> tuple[Booking | None, str]:
        """(the signed Booking, "") when ``proof`` lets ``host`` start ``instance`` now; else (None, why)."""
        now = self.clock()
        if len(self.taken) > 256:
            self.taken = {n: t for n, t in self.taken.items() if now - t <= 2 * booking_proof.TTL_S}
        why = booking_proof.problem(key, proof, instance, host, now, self.taken)
        if why:
            return None, why
        self.taken[proof.nonce] = now
        return proof.booking, ""


class HeldBookings:
    """An in-memory ledger: instance -> its Booking on this host, or the GPU indexes booked for its
    server alone (``[]``: CPU only)."""

    def __init__(self, held: dict[str, list[int] | Booking] | None = None):
        self.held = dict(held or {})

    async def booked(self, instance: str) -> Booking:
        got = self.held.get(instance)
        if got is None:
            return Booking()
        if isinstance(got, Booking):
            return got
        gpus = sorted(got)
        return Booking(booked=True, gpu_indexes=gpus, parts=[BookedPart(part="", role="server", gpu_indexes=gpus)])

    async def booked_here(self, instances: list[str]) -> dict[str, Booking]:
        out = {n: await self.booked(n) for n in instances}
        return {n: b for n, b in out.items() if b.booked}


def part_of(key: str) -> str:
    """The part a process key names: "" for ``m-0`` (the server), ``rpc0`` for ``m-0@rpc0``."""
    return key.partition("@")[2]


def _listed(parts: list[BookedPart]) -> str:
    return ", ".join(repr(p.part) for p in parts) or "none"


def refusal(key: str, host: str, role: str, gpus: list[int], booking: Booking) -> str | None:
    """Why a launch of the process ``key`` (instance, or instance@part) in ``role`` on ``gpus`` of
    ``host`` is refused given the ledger's ``booking`` (None: it may start)."""
    instance, part = instance_of(key), part_of(key)
    if not booking.booked:
        said = f"no booking in the ledger for instance {instance} on host {host}"
        why = f" ({booking.reason})" if booking.reason and booking.reason != said else ""
        return (f"{said}{why}: an instance launches only what the control plane booked for it "
                "(start it through its deployment)")
    booked = booking.part(part)
    if booked is None:
        return (f"instance {instance} has no part {part!r} booked on host {host} (booked here: "
                f"{_listed(booking.parts)}): one booking runs only the processes its placement needs")
    if booked.role != role:
        return f"part {part!r} of instance {instance} is booked on host {host} as {booked.role}, not {role}"
    allowed = set(booked.gpu_indexes) & set(booking.gpu_indexes)
    extra = sorted(set(gpus) - allowed)
    if extra:
        what = f"instance {instance}" + (f" (part {part})" if part else "")
        return (f"{what} asks for GPU(s) {', '.join(map(str, extra))} of host {host}, which the ledger "
                f"did not book for it (booked: {', '.join(map(str, sorted(allowed))) or 'none'})")
    return None
