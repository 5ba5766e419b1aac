"""The cluster workflow's activities (workflows/cluster.py): the writes behind its updates (the
tenants file, a key added, a key revoked). The store work is activities/cluster_reads.py's and
store/keys.py's; a refusal the operator can fix (a tenant still in use, an unknown key) fails the
update at once, non-retryable, with the store's message. The cluster's reads are no activity: the
reads workflow's queries (workflows/cluster_reads.py), answered by cluster_reads.py ``StoreReads``."""

from __future__ import annotations

from typing import Awaitable, Callable

from sqlalchemy.engine import Engine
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import callers, cluster_reads as r
from activities.estimate_cache import EstimateCache
from activities.runner import Runner
from activities.wake_queue import known_request
from contracts import cluster as cc
from store import keys
from scheduler.errors import InvalidInput
from scheduler.policy_config import PolicyConfig
from scheduler.tenancy.config import TenantsFile
from views.keys import key_view


class ClusterActivities:
    def __init__(self, engine: Engine, runner: Runner, estimates: EstimateCache, policy: PolicyConfig,
                 wake: Callable[..., Awaitable[int]]):
        """``estimates``: the requests this worker costed (a new file's verdicts know what the
        decisions knew); ``wake``: the PENDING queue's wake."""
        self.engine, self.runner = engine, runner
        self.estimates, self.policy, self.wake = estimates, policy, wake

    def all(self) -> list:
        return [self.apply_tenants, self.add_key, self.revoke_key, self.key_limits]

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
        return key_view(await self._store(keys.add_known, self.engine, k))

    @activity.defn(name=cc.REVOKE_KEY)
    async def revoke_key(self, k: cc.KeyRevoke) -> cc.KeyView:
        callers.check(cc.REVOKE_KEY, k)
        return key_view(await self._store(keys.revoke, self.engine, k.id))

    @activity.defn(name=cc.KEY_LIMITS)
    async def key_limits(self, k: cc.KeyLimits) -> cc.KeyView:
        """A key's own limits set or cleared (``gpuflow keys edit``)."""
        callers.check(cc.KEY_LIMITS, k)
        return key_view(await self._store(keys.set_limits, self.engine, k))
