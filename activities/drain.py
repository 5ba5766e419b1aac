"""Draining a replica before it is stopped: the instance is already out of the routing table
(recorded DRAINING; gateways route RUNNING replicas only), and this waits until the live
gateways report no request in flight on it, or the drain timeout passes.

A zero is trusted only once every gateway has had time to see the change: a gateway re-reads the
routing table and reports its counts every ``REPORT_S`` (0.5 s), so a request it sent just before
it saw DRAINING is in a report at most two periods later. ``SEEN_S`` (2 s) covers both, with
margin for a slow store.

``DrainActivities.drain_instance`` is the activity the instance workflow calls (task queue
``gpuflow-control``); ``wait_drained`` is its loop, with the store's reads passed in."""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

from sqlalchemy.engine import Engine
from temporalio import activity

from activities import callers
from activities.runner import Runner
from contracts import activity_names as c
from contracts.drain import DrainAsk
from store import serving
from store.serving import REPORT_S

SEEN_S = max(2.0, 2 * REPORT_S + 1.0)


async def wait_drained(in_flight: Callable[[], Awaitable[int]], gateways: Callable[[], Awaitable[int]],
                       beat: Callable[[int], None], timeout_s: float, poll_s: float = 0.2,
                       seen_s: float = SEEN_S, clock: Callable[[], float] = time.monotonic) -> int:
    """Requests still in flight when the wait ended: 0 once drained, more when ``timeout_s`` ran
    out. With no live gateway nothing can route to the replica, so nothing is waited for.
    ``beat(n)`` is called at every poll (the activity's heartbeat)."""
    if timeout_s <= 0 or not await gateways():
        return 0
    start = clock()
    while True:
        n = await in_flight()
        beat(n)
        waited = clock() - start
        if n == 0 and waited >= min(seen_s, timeout_s):
            return 0
        if waited >= timeout_s:
            return n
        await asyncio.sleep(max(0.0, min(poll_s, timeout_s - waited)))


class DrainActivities:
    def __init__(self, engine: Engine, runner: Runner):
        self.engine, self.runner = engine, runner

    def all(self) -> list:
        return [self.drain_instance]

    @activity.defn(name=c.DRAIN_INSTANCE)
    async def drain_instance(self, ask: DrainAsk) -> int:
        """Wait until the live gateways have no request in flight on ``ask.instance`` (already out
        of the routing table), at most ``ask.timeout_s``; returns the requests left."""
        callers.check(c.DRAIN_INSTANCE, ask)
        def read(fn, *args):  # in the pool, not heartbeating: wait_drained beats at every poll itself
            return self.runner.submit(fn, self.engine, *args)

        async def gateways() -> int:
            return len(await read(serving.live_gateways))

        return await wait_drained(lambda: read(serving.in_flight, ask.instance), gateways,
                                  lambda n: activity.heartbeat({"in_flight": n}), ask.timeout_s)
