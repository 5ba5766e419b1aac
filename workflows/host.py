"""HostWorkflow (id ``host/<worker>``): a host's liveness, the Temporal-native way.

The agent starts it (signal-with-start ``hello`` carrying its inventory). The workflow records
the host READY, then keeps a ``watch_host`` activity running on the host's own queue: the agent
heartbeats it, and it returns when the inventory changes. A missed heartbeat (or nobody polling
the queue) fails the activity: the host is recorded NOT_READY until the agent says hello again
or answers one of the probes sent to its queue meanwhile.
Every READY/inventory change wakes PENDING instances (in the host_seen activity). The watch's
report also carries each replica's measured memory (contracts/usage.py): kept as the host's
latest report (its ``status`` query answers it) and written to the store in one batch; and the
processes that ended (contracts/process_end.py): host_seen tells their instances, and the next
watch acknowledges them. An operator
forgets a host that is gone for good with the ``forget`` update (``gpuflow hosts forget``): its row
leaves the store and the workflow ends; a host that leaves for good (``gpuflow simulate``'s, on a
clean exit) says so with ``leave``, and is forgotten as soon as it holds no reservation. An operator cordons a host with the ``cordon`` update
(``gpuflow hosts cordon``): no new replica is placed there (the scheduler's cordon filter reads the
store's row) while those running there keep running, until the ``uncordon`` update.

Every report (the hello, each watch's and probe's answer, the usage it carries) is checked before it
changes anything (workflows/host_reports.py): signed by the host's own credential, fresh (a hello's
stamp is newer than the last; a watch's answer carries the nonce that watch was sent), or joining
with the cluster's join token. A report refused changes nothing; nothing but a checked report is
written to the store, so a host workflow that no joined host started holds no capacity."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from contracts import ui_text
    from contracts.host_auth import WatchAsk
    from contracts.process_end import EndRef, refs
    from contracts.ids import HOST_CORDON, HOST_FORGET, HOST_STATUS, HOST_UNCORDON, HOST_WORKFLOW, host_id
    from contracts.host import BookingAsk
    from contracts.control import CordonAsk, HostInput, HostReport, HostView, host_queue
    from contracts.hosts import HostCordon, HostLost, HostRef
    from contracts.host import BOOKING_UPDATE, BOOKINGS_UPDATE, Booking, BookingQuery, BookingsAsk, BookingsQuery, HostBookings
    from contracts import agent as hp
    from contracts.usage import RECORD_USAGE, UsageBatch
    from workflows import common as c
    from workflows import guards, messages
    from workflows.host_reports import HostReports, checked_report  # noqa: F401  (checked_report: its old home)
    from workflows.inputs import one_input


@workflow.defn(name=HOST_WORKFLOW)
class HostWorkflow(HostReports):
    @workflow.init
    def __init__(self, *args: Any) -> None:
        inp = one_input(args, HostInput, "HostWorkflow")
        self.inp, self.t = inp, inp.timings
        self.report = inp.report
        self.state = inp.state
        self._init_reports(inp.last_hello, inp.refusal)  # hellos queued, the last accepted, the last refused
        self.since = ""
        self.forgotten = False  # an operator forgot the host (update forget): the workflow ends
        self.leaving = inp.leaving  # it leaves for good (update leave): forgotten once it holds nothing
        self.reason = ""  # why it is NOT_READY, when it is for its report
        self.just_lost = False  # the watch failed a moment ago: probe at once (_probe)
        self.acked: list[EndRef] = []  # the process ends host_seen told: acknowledged in the next watch
        self.cordoned, self.cordon_reason = inp.cordoned, inp.cordon_reason  # an operator's (update cordon)
        self.cordoning = asyncio.Lock()  # one cordon change at a time: its store write, then the state

    @workflow.signal
    def hello(self, *args: Any) -> None:
        """The agent's report as it starts, signed (or anyone's: checked in the run loop, never here,
        against the MAC of the report as it arrived: contracts/host_auth.py ReportCheck)."""
        self._queue_hello(args[0] if len(args) == 1 else None)

    @workflow.update(name=HOST_FORGET)
    async def forget(self, *args: Any) -> str:
        """``gpuflow hosts forget``: a host gone for good leaves the store, and this workflow ends.
        Refused while the host holds reservations (records.forget_worker says whose). An agent that
        says hello later starts the host afresh. Takes no input."""
        problem = await workflow.execute_activity(c.HOST_FORGET, HostRef(name=self.inp.name), result_type=str | None,
                                                  **c.STORE_CALL)
        if problem:
            raise ApplicationError(problem, type="InvalidInput", non_retryable=True)
        self.forgotten = True
        return f"host {self.inp.name} forgotten"

    @workflow.update
    async def leave(self, *args: Any) -> str:
        """A host leaving for good (``gpuflow simulate``'s hosts, on a clean exit): forgotten by this
        workflow once it is NOT_READY and holds no reservation, with no ``gpuflow hosts forget``: at
        once when none of its replicas is left, else once they are placed elsewhere (after their
        unreachable grace). A hello meanwhile (it is back) cancels it. Takes no input."""
        self.leaving = True
        if self.state != "ready" and not self.forgotten:  # already gone: now, if it holds nothing
            self.forgotten = await self._left()
        return (f"host {self.inp.name} forgotten" if self.forgotten else
                f"host {self.inp.name} leaves: forgotten once it is NOT_READY and holds no reservation")

    @leave.validator
    def _check_leave(self, *args: Any) -> None:
        messages.none(args, "leave")
        self._check_live("leave")

    async def _left(self) -> bool:
        """Whether a leaving host is forgotten now (the forget activity found no reservation)."""
        problem = await workflow.execute_activity(c.HOST_FORGET, HostRef(name=self.inp.name), result_type=str | None,
                                                  **c.STORE_CALL)
        return problem is None

    @forget.validator
    def _check_forget(self, *args: Any) -> None:
        messages.none(args, "forget")
        if self.state == "ready" or self.greeting is not None:
            raise ValueError(f"host {self.inp.name} is READY; stop its agent first "
                             "(a host that answers keeps running its servers)")

    @workflow.update(name=HOST_CORDON)
    async def cordon(self, *args: Any) -> str:
        """``gpuflow hosts cordon``: no new replica is placed on this host; those running there keep
        running. Takes one optional CordonAsk (the operator's reason). Cordoning a cordoned host
        again changes only its reason."""
        ask = messages.one(args, CordonAsk, "cordon") if args else CordonAsk()
        if not await self._cordon(True, ask.reason):
            return f"host {self.inp.name} was already cordoned"
        return f"host {self.inp.name} cordoned: no new replicas are placed there; those running there keep running"

    @cordon.validator
    def _check_cordon(self, *args: Any) -> None:
        """Untrusted input, refused before anything is recorded: nothing, or one CordonAsk."""
        extra = sorted(set(args[0]) - set(CordonAsk.model_fields)) if len(args) == 1 and isinstance(args[0], dict) else []
        if extra:
            raise ValueError(f"cordon takes only a reason; it was given {', '.join(map(repr, extra))[:200]}")
        if args:
            messages.one(args, CordonAsk, "cordon")
        self._check_live("cordon")

    @workflow.update(name=HOST_UNCORDON)
    async def uncordon(self, *args: Any) -> str:
        """``gpuflow hosts uncordon``: new replicas may be placed here again, and the PENDING queue
        is woken (the host_cordon activity), so a replica waiting for room can take it now. Takes no input."""
        if not await self._cordon(False, ""):
            return f"host {self.inp.name} was not cordoned"
        return f"host {self.inp.name} uncordoned: new replicas may be placed there"

    @uncordon.validator
    def _check_uncordon(self, *args: Any) -> None:
        messages.none(args, "uncordon")
        self._check_live("uncordon")

    def _check_live(self, what: str) -> None:
        if self.forgotten:
            raise ValueError(f"host {self.inp.name} is being forgotten; there is nothing to {what}")

    async def _cordon(self, on: bool, reason: str) -> bool:
        """Cordon (``on``) or uncordon: the store's row first (the policy reads it), then this
        workflow's state and its current details. False when it was so already."""
        async with self.cordoning:
            if (self.cordoned, self.cordon_reason) == (on, reason):
                return False
            await self._record_cordon(on, reason)
            self.cordoned, self.cordon_reason = on, reason
            self._show()
            return True

    async def _record_cordon(self, on: bool, reason: str) -> None:
        await workflow.execute_activity(c.HOST_CORDON, HostCordon(name=self.inp.name, on=on, reason=reason),
                                        result_type=bool | None, **c.STORE_CALL)

    @workflow.update(name=BOOKING_UPDATE)
    async def booking(self, *args: Any) -> Booking:
        """The booking check: the host's agent asks, before it starts any process, which of this
        host's GPUs the ledger booked for the instance; the answer is the ledger's, read now, never
        what the launch request says (contracts/host.py)."""
        ask = messages.one(args, BookingQuery, BOOKING_UPDATE)
        return await workflow.execute_local_activity(
            c.BOOKING_ON, BookingAsk(instance=ask.instance, worker=self.inp.name), result_type=Booking,
            **c.STORE_LOCAL)

    @booking.validator
    def _check_booking(self, *args: Any) -> None:
        """Untrusted input, refused before anything is recorded: exactly one BookingQuery, no field
        besides its own (BookingQuery forbids them, naming each)."""
        messages.one(args, BookingQuery, BOOKING_UPDATE)

    @workflow.update(name=BOOKINGS_UPDATE)
    async def bookings(self, *args: Any) -> HostBookings:
        """The orphan check's read (worker_agent/reconcile.py) when the reads workflow's ``bookings``
        query gets no answer: which of the instances the agent runs processes for the ledger books
        on this host, and their parts."""
        ask = messages.one(args, BookingsQuery, BOOKINGS_UPDATE)
        return await workflow.execute_local_activity(
            c.BOOKINGS_ON, BookingsAsk(instances=ask.instances, worker=self.inp.name), result_type=HostBookings,
            **c.STORE_LOCAL)

    @bookings.validator
    def _check_bookings(self, *args: Any) -> None:
        """Untrusted input, refused before anything is recorded: exactly one BookingsQuery."""
        messages.one(args, BookingsQuery, BOOKINGS_UPDATE)

    @workflow.query(name=HOST_STATUS)
    def status(self) -> HostView:
        return HostView(name=self.inp.name, state=self.state, report=self.report, since=self.since, reason=self.reason,
                        cordoned=self.cordoned, cordon_reason=self.cordon_reason, refusal=self.refusal)

    async def _set(self, state: str, reason: str = "") -> None:
        self.state, self.since, self.reason = state, workflow.now().isoformat(), reason
        workflow.upsert_search_attributes([c.SA_STATE.value_set(state.upper())])
        self._show()

    def _show(self) -> None:
        """The Temporal UI's current details: the state, the cordon, the last report refused, and the GPUs
        the last report named."""
        r = self.refusal
        refused = f"\n**REFUSED** a {r.purpose} report at {r.at}: {ui_text.code(r.why[:500])}" if r is not None else ""
        workflow.set_current_details(ui_text.host_current(self.state, self.reason, self.cordoned, self.cordon_reason)
                                     + refused
                                     + ("\n" + ui_text.host_details(self.report) if self.report is not None else ""))

    @workflow.run
    async def run(self, *args: Any) -> None:
        inp = self.inp
        guards.names(worker=inp.name)
        guards.workflow_id(host_id(inp.name), f"worker name {inp.name!r}")
        workflow.upsert_search_attributes([c.SA_WORKER.value_set(inp.name)])
        while True:
            await self._take_hellos()
            if self.greeting is not None:
                proven, self.greeting = self.greeting, None
                if not await self._seen(proven):  # refused by host_seen's own check: nothing changed
                    continue
                self.report = proven[0].model_copy(update={"ended": None})
                self.acked = refs(proven[0].ended)  # told: the agent forgets them at the next watch
                if self.cordoned:  # cordoned before its first hello, its row did not exist: now it says so
                    async with self.cordoning:
                        await self._record_cordon(self.cordoned, self.cordon_reason)
                await self._set("ready")
                self.forgotten = self.leaving = False  # it said hello (perhaps as it was forgotten): it is back
            if self.leaving and self.state != "ready" and not self.forgotten:
                self.forgotten = await self._left()
            if self.forgotten and self.state != "ready":
                await workflow.wait_condition(workflow.all_handlers_finished)
                return
            if self.state == "ready" and self.report is not None:
                await self._watch(self.report.fingerprint())
            else:
                await self._probe()
            if workflow.info().is_continue_as_new_suggested():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(HostInput(name=inp.name, timings=self.t, report=self.report, state=self.state,
                                                   cordoned=self.cordoned, cordon_reason=self.cordon_reason,
                                                   last_hello=self.last_hello, refusal=self.refusal,
                                                   leaving=self.leaving))

    async def _refuse(self, why: str) -> None:
        """A report that does not validate: the host is NOT_READY with the reason (the store's row
        too, so the policy leaves it out), and its replicas hear it as lost."""
        await workflow.execute_activity(c.HOST_LOST, HostLost(name=self.inp.name, reason=why), **c.STORE_CALL)
        await self._set("not_ready", why)
        self.report = None  # nothing of the host is watched until a valid report

    async def _probe(self) -> None:
        """NOT_READY: wait for a hello, and meanwhile ask the host queue again now and then, so
        an agent that was only cut off (a network split, a Temporal restart) comes back READY
        without restarting. Right after the watch failed, it asks at once: after a Temporal outage
        longer than the heartbeat timeout every host's watch fails, while every agent still polls,
        and each host stayed NOT_READY for host_schedule_to_start_s (no replica placed there)."""
        lost, self.just_lost = self.just_lost, False
        if lost:
            return await self._ask()
        try:
            await workflow.wait_condition(lambda: bool(self.hellos) or self.forgotten,
                                          timeout=c.secs(self.t.host_schedule_to_start_s))
            return
        except asyncio.TimeoutError:
            pass
        await self._ask()

    async def _ask(self) -> None:
        """One probe on the host's queue: a report from an agent that answers (checked: signed for
        this probe's nonce) is taken as its hello."""
        nonce = self._nonce()
        h = workflow.start_activity(
            hp.WATCH_HOST, WatchAsk(nonce=nonce), result_type=dict, task_queue=host_queue(self.inp.name),
            schedule_to_start_timeout=c.secs(self.t.host_schedule_to_start_s),
            start_to_close_timeout=c.secs(self.t.host_watch_s), heartbeat_timeout=c.secs(self.t.host_heartbeat_s),
            retry_policy=RetryPolicy(maximum_attempts=1))
        await workflow.wait_condition(lambda: h.done() or self.forgotten)
        if not h.done():  # forgotten: nobody is left to answer the probe
            h.cancel()
        try:
            raw = await h
        except (ActivityError, asyncio.CancelledError):
            return
        proven = await self._checked(raw, "watch", nonce)
        if proven is not None:
            self.greeting = proven

    async def _watch(self, known: str) -> None:
        """One watch on the host's queue, for the inventory ``known``: its answer, checked (signed for
        this watch's nonce), is the host's news. A hello that passes its check meanwhile (the agent
        restarted) ends it. An answer refused (another agent polling the host's queue, a forgery)
        changes nothing, and the next watch waits host_heartbeat_s: a stream of them costs little."""
        nonce = self._nonce()
        h = workflow.start_activity(
            hp.WATCH_HOST, WatchAsk(known=known, nonce=nonce, acked=self.acked), result_type=dict,
            task_queue=host_queue(self.inp.name),
            schedule_to_start_timeout=c.secs(self.t.host_schedule_to_start_s),
            start_to_close_timeout=c.secs(self.t.host_watch_s),
            heartbeat_timeout=c.secs(self.t.host_heartbeat_s), retry_policy=RetryPolicy(maximum_attempts=1))
        while not h.done() and self.greeting is None:
            await workflow.wait_condition(lambda: h.done() or bool(self.hellos))
            await self._take_hellos()
        if self.greeting is not None:  # the agent restarted and said hello: start over with its report
            h.cancel()
            try:
                await h
            except (ActivityError, asyncio.CancelledError):
                pass
            return
        try:
            raw = h.result()
        except ActivityError as e:
            why = f"agent stopped answering: {c.cause(e)[1]}"[:1000]
            await workflow.execute_activity(c.HOST_LOST, HostLost(name=self.inp.name, reason=why), **c.STORE_CALL)
            await self._set("not_ready", why)
            self.just_lost = True
            return
        proven = await self._checked(raw, "watch", nonce)
        if proven is None:
            if self.state == "ready":  # refused, not the host's own invalid report (that made it NOT_READY)
                await self._pause()
            return
        report = proven[0]
        if report.usage is not None:
            await self._record_usage(report)
        if report.fingerprint() != known:
            self.greeting = proven
            return
        if report.ended:  # host_seen tells each instance its process ended; refused, the next watch waits
            if await self._seen(proven):
                self.acked = refs(report.ended)
            else:
                await self._pause()
        if report.usage is not None:  # the same inventory with the replicas' latest memory: the status query shows it
            self.report = report.model_copy(update={"ended": None})

    async def _pause(self) -> None:
        """A report refused: the next watch waits host_heartbeat_s (a hello ends the wait), so a
        stream of refused reports costs little."""
        try:
            await workflow.wait_condition(lambda: bool(self.hellos), timeout=c.secs(self.t.host_heartbeat_s))
        except asyncio.TimeoutError:
            pass

    async def _record_usage(self, report: HostReport) -> None:
        """The replicas' measured memory into the store, one batch per report (store/usage.py). Best
        effort: a store that does not answer costs these figures, and the next report brings newer."""
        try:
            await workflow.execute_local_activity(
                RECORD_USAGE, UsageBatch(host=self.inp.name, replicas=report.usage or []),
                start_to_close_timeout=c.secs(30),
                retry_policy=RetryPolicy(maximum_attempts=3, initial_interval=c.secs(1)))
        except ActivityError:
            pass
