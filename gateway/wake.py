"""Waking an autoscaler: a request for a deployment with no RUNNING replica (scaled to zero) is
held in the queue, and the gateway signals ``wake`` to the deployment's ``autoscaler/<name>``
workflow at once, so the replica starts now rather than at the next interval. At most one signal
per model every WAKE_EVERY_S; a deployment without an autoscaler (no such workflow) and an
unreachable Temporal are logged, never a failed request (it still waits for a replica)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from contracts.ids import AUTOSCALER_WAKE, autoscaler_id

log = logging.getLogger("gpuflow.gateway.wake")
WAKE_EVERY_S = 2.0


class Waker:
    def __init__(self, temporal, before: Callable[[str], None] = lambda m: None):
        """``temporal``: gpuflow.settings.TemporalSettings (None: never wake). ``before(model)``
        runs just before the signal (the gateway publishes its queue depth, for the step to read)."""
        self.temporal, self.before = temporal, before
        self.last: dict[str, float] = {}
        self.client = None
        self.tasks: set[asyncio.Task] = set()

    def poke(self, model: str) -> None:
        now = time.monotonic()
        if self.temporal is None or now - self.last.get(model, -WAKE_EVERY_S) < WAKE_EVERY_S:
            return
        self.last[model] = now
        t = asyncio.get_running_loop().create_task(self._signal(model))
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)

    async def _signal(self, model: str) -> None:
        await asyncio.sleep(0)  # the request is queued first
        try:
            self.before(model)
            if self.client is None:
                from gpuflow.runtime import connect

                self.client = await connect(self.temporal, wait_s=5)
            await self.client.get_workflow_handle(autoscaler_id(model)).signal(AUTOSCALER_WAKE)
        except Exception as e:  # noqa: BLE001  no autoscaler, Temporal away: the request still waits
            log.info("could not wake autoscaler/%s: %s", model, e)
