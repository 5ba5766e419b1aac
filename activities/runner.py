"""The thread pool that runs the control plane's blocking work (store transactions, file reads,
estimates) off the event loop, and the heartbeat kept while an activity waits on it.

Every activity class that blocks takes the one ``Runner`` of its worker, so the pool's size is one
setting for the whole worker (activities/worker_set.py), as it was when one class held them all."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from temporalio import activity


class Runner:
    def __init__(self, threads: int = 16):
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="gpuflow-store")

    def submit(self, fn, *args) -> asyncio.Future:
        """``fn(*args)`` in the pool, no heartbeat: for callers that beat themselves (a drain) or
        batch several activities' work into one call (the group commit, the place batch)."""
        return asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def run(self, fn, *args, cancel: threading.Event | None = None):
        """Run blocking store/file work in the pool, heartbeating meanwhile: a control-plane
        worker that dies mid-call is noticed within the heartbeat timeout, not start-to-close.
        A cancelled activity sets ``cancel``, for work that can stop (an estimate)."""
        return await self.heartbeating(self.submit(fn, *args), cancel)

    @staticmethod
    async def heartbeating(fut: asyncio.Future, cancel: threading.Event | None = None):
        """``fut``'s result, heartbeating every second meanwhile (not in a local activity)."""
        while True:
            try:
                done, _ = await asyncio.wait({fut}, timeout=1.0)
            except asyncio.CancelledError:
                if cancel is not None:
                    cancel.set()
                raise
            if done:
                return fut.result()
            if not activity.info().is_local:  # a local activity has no heartbeat (the workflow's task waits on it)
                activity.heartbeat()

    def shutdown(self, wait: bool = True) -> None:
        self.pool.shutdown(wait=wait)
