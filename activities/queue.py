"""The tenancy and queue activities (task queue ``gpuflow-control``): the operator's limits and the
tenants file, for a deployment to check its spec against, and the periodic sweep of the PENDING
queue (workflows/queue_sweep.py; the wake itself is activities/wake_queue.py's)."""

from __future__ import annotations

from typing import Awaitable, Callable

from sqlalchemy.engine import Engine
from temporalio import activity

from activities import callers
from activities.runner import Runner
from contracts import activity_names as c
from contracts.queue import TenantAsk
from contracts.limits import Limits
from store import tenants


class QueueActivities:
    def __init__(self, engine: Engine, runner: Runner, wake: Callable[..., Awaitable[int]], limits: Limits,
                 pending_recheck_s: float):
        """``wake``: the PENDING queue's wake (wake_queue.Waker); ``limits``: this server's settings;
        ``pending_recheck_s``: the sweep's period."""
        self.engine, self.runner, self.wake = engine, runner, wake
        self.limits, self.pending_recheck_s = limits, pending_recheck_s

    def all(self) -> list:
        return [self.deployment_limits, self.tenant_problem, self.sweep_queue]

    @activity.defn(name=c.DEPLOYMENT_LIMITS)
    async def deployment_limits(self) -> Limits:
        """The operator's limits (this server's settings), for a deployment to check against."""
        return self.limits

    @activity.defn(name=c.TENANT_PROBLEM)
    async def tenant_problem(self, ask: TenantAsk) -> str | None:
        """Why a spec naming ``ask.tenant`` is refused (not in the tenants file), else None."""
        return await self.runner.run(tenants.problem, self.engine, ask.tenant)

    @activity.defn(name=c.SWEEP_QUEUE)
    async def sweep_queue(self) -> float:
        """The periodic sweep of the PENDING queue (workflows/queue_sweep.py); returns how long
        to wait before the next, this worker's ``pending_recheck_s``."""
        callers.check(c.SWEEP_QUEUE, None)
        await self.wake(sweep=True)
        return self.pending_recheck_s
