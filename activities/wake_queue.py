"""The PENDING queue's I/O: read the queue from the store, ask the pure policy
(scheduler/tenancy/queue.py) which heads now fit, and signal only those (``capacity_changed``).
``Waker.wake`` (a release, a host joining or changing, the sweep) comes here; so does ``gpuflow queue``,
which shows the same verdicts without signalling anyone.

The rules (README, "The PENDING queue"):
- The queue is every PENDING instance of a live deployment, ordered by tenant priority, then
  deployment priority, then arrival (``queued_at``: when it entered the queue), then the name.
- A replica's request is the one the place activity last costed for its spec on this
  control-plane worker (EstimateCache.peek); a spec that states its resources is estimated here
  (nothing to read). A replica whose request is not known here is woken anyway: it decides
  itself, and its decision warms this worker's cache for the next wake.
- Heads that now fit are woken in order, each booked on the cached snapshot before the next is
  tried; those that would take their tenant over a limit are not woken (the quota is their
  reason). BestEffortFIFO or StrictFIFO, as the tenants file says.
- Replicas that do not fit but whose tenant stays within its guarantee with them, while another
  tenant borrows, are woken as well, every one the guarantee covers at once: they decide
  together and preempt as a group.
- One reason, everywhere (activities/pending_reasons.py): every wake writes each waiting replica
  its verdict as its reason in the store, and every view shows the store's, so ``gpuflow status``,
  ``explain``, ``queue`` and the console show the same text, current with the capacity (freed, or
  taken by a booking: ``wake(taken=True)``), the tenants file and the preemptors.
- Safety net: the queue is swept every ``pending_recheck_s`` (workflows/queue_sweep.py), waking
  the heads that fit and the first waiting replica of each deployment; a PENDING replica keeps
  no timer of its own (before the ``queue-sweep`` patch it re-decided on its own every period).

Wakes in one process run one at a time; a wake asked for while another already waits for its
turn is folded into that one, which reads the store after the change that asked for it (Turns).
A wake waiting for its turn heartbeats, and the activities that wake (a release, a host seen)
wake again on a retry, when the first try's wake may have been lost with it."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable

from sqlalchemy.engine import Engine
from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from contracts.ids import INSTANCE_CAPACITY_CHANGED, instance_id
from activities.estimate_cache import EstimateCache
from activities.pending_reasons import TAKEN_S, changed, current, shown  # noqa: F401  (current, shown: the views')
from store import records
from store.pending_queue import Queue, Queued, ordered_replicas, read  # noqa: F401  (read: the wake's, and tests')
from store.snapshot_cache import SnapshotCache
from scheduler.cluster import ClusterSnapshot
from scheduler.errors import GpuflowError
from scheduler.estimate import states_resources
from scheduler.policy_config import PolicyConfig
from scheduler.request import Request
from scheduler.spec import ModelSpec
from scheduler.tenancy.queue import Wake, quotas_of, to_wake

log = logging.getLogger("gpuflow.control")
SIGNAL_TRIES = 4  # a wake's signal, at most: 0.5 + 1 + 2 s between them
UNKNOWN = "its request is not known here yet: woken to decide itself"
UNKNOWN_HERE = "its request is not known here yet"


@dataclass
class Verdict:
    """The queue in order, what to wake, and why every other replica waits."""

    order: list[Queued]
    wake: Wake
    unknown: list[str]  # no request known: woken to decide themselves
    bar: tuple[int, int] | None = None  # the highest priority woken to take freed capacity (None: none is)

    def to_signal(self) -> list[str]:
        return self.wake.woken + self.wake.reclaim + self.unknown

    def to_sweep(self) -> list[str]:
        """What the periodic sweep wakes (workflows/queue_sweep.py), a number that grows with the
        deployments waiting, not their replicas: the heads that fit, and the first waiting replica
        of each deployment (its request may not be known here; it may preempt; a new tenants file
        may have raised its limit), unless it ranks below a replica woken to take the capacity
        freed now (``bar``): woken too, it would race that replica for it and could win."""
        out, deps = list(self.wake.woken) + self.wake.reclaim, set()
        for r in self.order:
            if r.deployment not in deps:
                deps.add(r.deployment)
                if self.bar is None or r.level >= self.bar:
                    out.append(r.instance)
        return list(dict.fromkeys(out))

    def ahead_of(self, name: str) -> str | None:
        """The first replica ranked ahead of ``name`` that is woken to take capacity freed now,
        when ``name`` itself is not woken: the queue gives that capacity to those ahead of it
        (activities/queue_gate.py). None when ``name`` is woken, or nobody ahead of it is."""
        if name in self.wake.woken or name in self.wake.reclaim:
            return None
        woken = set(self.wake.woken)
        for r in self.order:
            if r.instance == name:
                return None
            if r.instance in woken:
                return r.instance
        return None

    def reason(self, name: str) -> str:
        if name in self.unknown:
            return UNKNOWN
        if name in self.wake.woken:
            return "fits now: woken"
        if name in self.wake.reclaim:
            return "within its tenant's guarantee while another tenant borrows: woken to preempt"
        return self.wake.held.get(name, "")


def judge_and_record(engine: Engine, snap: ClusterSnapshot, request_of: Callable[[ModelSpec], Request | None],
                     policy: PolicyConfig | None = None, decided_only: bool = False) -> tuple["Verdict", int]:
    """The queue's verdicts on ``snap``, written as the waiting replicas' reasons (one reason, kept
    current): (the verdict, how many reasons changed). Every wake runs it before it signals; so does
    ``gpuflow tenants apply``, waking nobody, so a new limit or guarantee shows in every reason at once.
    ``decided_only``: the replicas that recorded a decision alone (a judgement for the reasons alone,
    after a booking: one just started decides, and records its reason, by itself)."""
    q = read(engine)
    if decided_only:
        q.replicas = [r for r in q.replicas if r.decided]
    v = judge(q, snap, request_of, policy)
    return v, records.set_pending_reasons(engine, changed(v))


def judge(q: Queue, snap: ClusterSnapshot, request_of: Callable[[ModelSpec], Request | None],
          policy: PolicyConfig | None = None) -> Verdict:
    """The pure part: which replicas of ``q`` to wake on ``snap``, and why the others wait."""
    specs: dict[str, tuple[ModelSpec, Request]] = {}
    for dep, raw in q.specs.items():
        try:
            spec = ModelSpec.model_validate(raw)
        except ValueError:  # its replicas fail on their own, with the reason
            continue
        try:
            req = request_of(spec)
        except (GpuflowError, ValueError):  # costing failed: unknown here (its replicas find out themselves)
            req = None
        if req is not None:
            specs[dep] = (spec, req)
    known = [r for r in q.replicas if r.deployment in specs]
    unknown = [r.instance for r in ordered_replicas(q.replicas) if r.deployment not in specs]
    quotas = quotas_of(snap, q.tenants, q.tenant_of)  # limits, guarantees, flavors, fair sharing (tenancy/queue.py)
    wake = to_wake(snap, [r.waiting() for r in known], specs, strict=q.tenants.queueing == "StrictFIFO",
                   config=policy, quotas=quotas)
    order = ordered_replicas(q.replicas)
    return Verdict(order, wake, *_behind_the_woken(order, wake, unknown))


def _behind_the_woken(order: list[Queued], wake: Wake, unknown: list[str]) -> tuple[list[str], tuple[int, int] | None]:
    """(the unknown replicas to wake, the bar): a replica whose request is not known here decides
    itself when woken, so one of lower priority than a replica woken to take the capacity freed now
    waits (its reason says so) rather than race it for that capacity: the first freed GPU goes by
    priority whoever books first."""
    levels = {r.instance: r.level for r in order}
    bar = max((levels[n] for n in wake.woken), default=None)
    if bar is None:
        return unknown, None
    first = next(n for n in wake.woken if levels[n] == bar)
    woken = [n for n in unknown if levels[n] >= bar]
    for n in unknown:
        if levels[n] < bar:
            wake.held[n] = f"held back while {first} (higher priority) takes the capacity freed now; {UNKNOWN_HERE}"
    return woken, bar


class Turns:
    """One wake at a time per process. A wake asked for while another already waits for its turn
    is folded into that one, which reads the store after the change that asked for it."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.waiting = False

    async def take(self, beat: Callable[[], None], every: float = 1.0, fold: bool = True) -> bool:
        """True once the caller holds the turn (``release`` it after); False when folded into a
        waiter (never with ``fold`` False). ``beat`` is called every ``every`` s of waiting (the
        activity's heartbeat)."""
        if self.waiting and fold:
            return False
        self.waiting = True
        try:
            while True:
                try:
                    await asyncio.wait_for(self.lock.acquire(), timeout=every)
                    return True
                except asyncio.TimeoutError:
                    beat()
        finally:
            self.waiting = False  # also when cancelled while waiting: a flag left set would fold every later wake away

    def release(self) -> None:
        self.lock.release()


def known_request(cache, spec: ModelSpec) -> Request | None:
    """What the place activity costed for ``spec`` here; a spec stating its resources is
    estimated at once (nothing to read); otherwise None (unknown)."""
    req = cache.peek(spec)
    if req is None and states_resources(spec):
        req = cache.get(spec)
    return req


class Waker:
    """Wakes the PENDING queue's heads for a control-plane worker; one per worker, shared by every
    activity that wakes (a release, a host seen, a closed workflow, the sweep), so its Turns keep
    their wakes one at a time. ``snapshots`` and ``estimates``: the worker's caches (the decisions'
    snapshot, the requests its decisions costed); ``run``: blocking work in its pool, heartbeating."""

    def __init__(self, engine: Engine, client: Client, snapshots: SnapshotCache, estimates: EstimateCache, policy: PolicyConfig,
                 run: Callable[..., Awaitable]):
        self.engine, self.client, self.snapshots, self.estimates, self.policy = engine, client, snapshots, estimates, policy
        self.run = run
        self.turns = Turns()
        self.rejudging: asyncio.Task | None = None  # the judgement a booking asked for (``taken``)
        self.claims = None  # activities/claims_read.py: a PENDING replica is judged with the claim it would book

    def _plan(self, decided_only: bool = False) -> Verdict:
        snap = self.snapshots.refresh(self.engine)[0]
        return judge_and_record(self.engine, snap, self.request, self.policy, decided_only)[0]

    def request(self, spec: ModelSpec) -> Request | None:
        """What a PENDING replica of ``spec`` would book if placed now: its known request, with a
        learned claim under mode apply (activities/claims_read.py)."""
        req = known_request(self.estimates, spec)
        return self.claims.apply(spec, req) if req is not None and self.claims is not None else req

    async def wake(self, sweep: bool = False, taken: bool = False) -> int:
        """Signal the heads that now fit (and those whose request is unknown here); returns how many
        were signalled. ``sweep``: the periodic sweep's choice instead (Verdict.to_sweep); it is
        never folded away. ``taken``: a booking took capacity; nobody can fit for it, so nobody is
        signalled, but the waiting replicas' reasons are judged again within TAKEN_S (one
        judgement for every booking meanwhile), in the background: the booking does not wait. Only
        the replicas that recorded a decision are judged then: in a burst, the replicas just started
        are most of the queue, each decides by itself within moments, and judging them cost a whole
        decision each for a reason their own decision overwrites (issue 37: a fifth of the control
        plane's CPU at 400 replicas)."""
        if taken:
            if self.rejudging is None or self.rejudging.done():
                # its own context: the booking's activity ends first, and this must not heartbeat for it
                self.rejudging = asyncio.get_running_loop().create_task(self._rejudge(), context=contextvars.Context())
            return 0
        if not await self.turns.take(_beat, fold=not sweep):
            return 0  # one already waits for its turn and will read this change
        try:
            verdict = await self.run(self._plan)
            names = verdict.to_sweep() if sweep else verdict.to_signal()
            for n in names:
                _beat()
                await self._signal(n)
        finally:
            self.turns.release()
        return len(names)

    async def _signal(self, name: str) -> None:
        """Wake ``name``'s workflow. One that ended meanwhile is nobody's; a signal that fails any
        other way (the server busy: a deadline) is sent again, SIGNAL_TRIES in all, since its
        replica's reason already says it was woken and nothing else would wake it before the
        next wake or the sweep (pending_recheck_s)."""
        for attempt in range(SIGNAL_TRIES):
            try:
                await self.client.get_workflow_handle(instance_id(name)).signal(INSTANCE_CAPACITY_CHANGED)
                return
            except RPCError as e:
                if e.status == RPCStatusCode.NOT_FOUND:
                    return  # ended meanwhile
                if attempt + 1 == SIGNAL_TRIES:
                    log.warning("could not wake %s after %d tries: %s; the next wake or sweep does", name,
                                SIGNAL_TRIES, e)
                    return
                _beat()
                await asyncio.sleep(0.5 * 2 ** attempt)


    async def _rejudge(self) -> None:
        await asyncio.sleep(TAKEN_S)
        if not await self.turns.take(lambda: None):
            return  # a wake waits for its turn: it judges after this booking
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._plan, True)
        except Exception as e:  # noqa: BLE001  the next wake or sweep judges again
            log.warning("the PENDING queue's reasons after a booking: %s", e)
        finally:
            self.turns.release()


def _beat() -> None:
    if activity.in_activity() and not activity.info().is_local:
        activity.heartbeat()
