"""The cluster workflow's activities (workflows/cluster.py): the writes behind its updates (the
tenants file, a key added, a key revoked) and the reads it answers through the control plane
(keys, tenants, the PENDING queue, serving). The store work is activities/cluster_reads.py's; a
refusal the operator can fix (a tenant still in use, an unknown key) fails the update at once,
non-retryable, with the store's message."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Awaitable, Callable

from sqlalchemy.engine import Engine
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import callers, cluster_reads as r
from store import decision_replay
from activities.estimate_cache import EstimateCache
from activities.runner import Runner
from activities.wake_queue import known_request
from contracts import cluster as cc
from store import keys
from scheduler.errors import InvalidInput
from scheduler.policy_config import PolicyConfig
from scheduler.tenancy.config import TenantsFile


class ClusterActivities:
    def __init__(self, engine: Engine, reads: Engine, runner: Runner, estimates: EstimateCache, policy: PolicyConfig,
                 wake: Callable[..., Awaitable[int]]):
        """``reads``: the read-only engine (db.reader); ``estimates``: the requests this worker
        costed (a queue verdict knows what the decisions knew); ``wake``: the PENDING queue's wake."""
        self.engine, self.reads, self.runner = engine, reads, runner
        self.estimates, self.policy, self.wake = estimates, policy, wake

    def all(self) -> list:
        return [self.apply_tenants, self.add_key, self.revoke_key, self.read_keys, self.read_tenants,
                self.read_queue, self.read_serving, self.read_audit, self.read_key_usage]

    def _request(self, spec):
        return known_request(self.estimates, spec)

    async def _store(self, fn, *args):
        try:
            return await self.runner.run(fn, *args)
        except InvalidInput as e:
            raise ApplicationError(str(e), type="InvalidInput", non_retryable=True) from None

    @activity.defn(name=cc.APPLY_TENANTS)
    async def apply_tenants(self, ask: cc.TenantsApply) -> cc.TenantsApplied:
        """Store the tenants file, give the waiting replicas their reasons under it, and wake the
        heads it lets through now (a raised limit), not at the next sweep."""
        callers.check(cc.APPLY_TENANTS, ask)
        tf = TenantsFile.model_validate(ask.file)
        done = await self._store(r.apply_tenants, self.engine, tf, self._request, self.policy)
        await self.wake()
        return done

    @activity.defn(name=cc.ADD_KEY)
    async def add_key(self, k: cc.KeyAdd) -> cc.KeyView:
        """Store a key, for a tenant the tenants file names (``default`` always is): a key for a
        tenant that does not exist is refused, naming the tenants that do."""
        callers.check(cc.ADD_KEY, k)
        return r.key_view(await self._store(keys.add_known, self.engine, k))

    @activity.defn(name=cc.REVOKE_KEY)
    async def revoke_key(self, k: cc.KeyRevoke) -> cc.KeyView:
        callers.check(cc.REVOKE_KEY, k)
        return r.key_view(await self._store(keys.revoke, self.engine, k.id))

    @activity.defn(name=cc.READ_KEYS)
    async def read_keys(self, page: cc.Page) -> cc.KeysPage:
        return await self._store(r.keys_page, self.reads, page)

    @activity.defn(name=cc.READ_KEY_USAGE)
    async def read_key_usage(self, page: cc.Page) -> cc.UsagePage:
        return await self._store(r.key_usage_page, self.reads, page, datetime.now(timezone.utc))

    @activity.defn(name=cc.READ_TENANTS)
    async def read_tenants(self, page: cc.Page) -> cc.TenantsPage:
        return await self._store(r.tenants_page, self.reads, page)

    @activity.defn(name=cc.READ_QUEUE)
    async def read_queue(self, page: cc.Page) -> cc.QueuePage:
        # the writer: the reasons it judges are recorded (activities/pending_reasons.py)
        return await self._store(r.queue_page, self.engine, page, self._request, self.policy, datetime.now(timezone.utc))

    @activity.defn(name=cc.READ_SERVING)
    async def read_serving(self, ask: cc.ServingAsk) -> cc.ServingView:
        return await self._store(r.serving_view, self.reads, ask)

    @activity.defn(name=cc.READ_AUDIT)
    async def read_audit(self, ask: cc.AuditAsk) -> cc.AuditView:
        """A kept decision replayed with this worker's build (and, ``with_settings``, its weights),
        compared with the store's copy of its record; or a deployment's kept decisions."""
        if ask.history:
            return cc.AuditView(rows=await self._store(decision_replay.history, self.reads, ask.name, ask.limit))
        return cc.AuditView(replay=await self._store(decision_replay.replay, self.reads, ask.name, None,
                                                     ask.decision or None, self.policy if ask.with_settings else None))
