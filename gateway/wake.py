"""Waking an autoscaler: a request for a deployment with no RUNNING replica (scaled to zero) is
held in the queue, and the gateway wakes the deployment's autoscaler at once, so the replica
starts now rather than at the next interval. At most one wake per model every WAKE_EVERY_S; a
deployment without an autoscaler and an unreachable Temporal are logged, never a failed request
(it still waits for a replica).

The wake itself is a seam (``Wake``: one method), so the serving path imports no Temporal client:
``gpuflow gateway`` hands it one that signals ``wake`` to the ``autoscaler/<name>`` workflow
(gpuflow/gateway_seams.py ``TemporalWake``); a gateway built without one never wakes."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Protocol

log = logging.getLogger("gpuflow.gateway.wake")
WAKE_EVERY_S = 2.0


class Wake(Protocol):
    async def wake(self, model: str) -> None:
        """Wake ``model``'s autoscaler; raises when it cannot (no autoscaler, Temporal away)."""


class Waker:
    def __init__(self, wake: Wake | None, before: Callable[[str], None] = lambda m: None):
        """``wake``: the seam (None: never wake). ``before(model)`` runs just before each wake (the
        gateway publishes its queue depth, for the autoscaler's step to read)."""
        self.wake, self.before = wake, before
        self.last: dict[str, float] = {}
        self.tasks: set[asyncio.Task] = set()

    def poke(self, model: str) -> None:
        now = time.monotonic()
        if self.wake is None or now - self.last.get(model, -WAKE_EVERY_S) < WAKE_EVERY_S:
            return
        self.last[model] = now
        t = asyncio.get_running_loop().create_task(self._wake(model))
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)

    async def _wake(self, model: str) -> None:
        await asyncio.sleep(0)  # the request is queued first
        try:
            self.before(model)
            await self.wake.wake(model)
        except Exception as e:  # noqa: BLE001  no autoscaler, Temporal away: the request still waits
            log.info("could not wake autoscaler/%s: %s", model, e)
