"""Who is asking: ``Authorization: Bearer K`` names a tenant through its API key. While no key
was ever created the gateway is open (every request is tenant ``default``, and may use every
model; its limits, its queue priority and its metrics are ``default``'s, as the README says);
once one exists, every request needs a valid one, and its tenant decides which models it
may use (gateway/table.py). Verdicts are cached ``key_cache_s`` (one store read per key per
second at most), so a revocation takes effect within about two seconds.

A key's scope (contracts/cluster.py) decides the rest: a ``metrics`` key reads /metrics and
nothing else (403 on /v1); with ``--metrics-key-required`` /metrics takes only cluster-admin and
metrics keys (its series name every tenant). Every other scope is served on /v1 as its tenant."""

from __future__ import annotations

import asyncio
import time

from sqlalchemy.engine import Engine

from contracts.cluster import CLUSTER_ADMIN, METRICS
from store import keys

ANONYMOUS = "default"  # an open gateway's tenant: gateway.table.DEFAULT_TENANT, tenant_limits.DEFAULT
MAX_CACHED = 10_000
METRICS_READERS = (CLUSTER_ADMIN, METRICS)  # the scopes that read /metrics under --metrics-key-required


class NoKey(Exception):
    """No valid key: 401."""


class NotAllowed(Exception):
    """A valid key whose scope does not allow this: 403, naming what is missing."""


class Auth:
    def __init__(self, engine: Engine, cache_s: float):
        self.engine, self.cache_s = engine, cache_s
        self.required = False  # set by the refresh loop: a key exists
        self.cache: dict[str, tuple[keys.KeyInfo | None, float]] = {}

    async def tenant(self, authorization: str | None) -> str:
        """The caller's tenant; NoKey (with the reason) when the request must be refused."""
        return (await self.caller(authorization))[0]

    async def caller(self, authorization: str | None) -> tuple[str, bool]:
        """(the caller's tenant, whether a key named it); NoKey when the request must be refused.
        An open gateway's requests are ``(ANONYMOUS, False)``: they may use every model, while a
        key of tenant ``default`` is (``default``, True): ``default``'s models and those shared, no more."""
        return (await self.who(authorization))[:2]

    async def who(self, authorization: str | None) -> tuple[str, bool, str]:
        """``caller``'s answer and the key's id (``""`` on an open gateway): what usage is counted under."""
        return (await self.whose(authorization))[:3]

    async def whose(self, authorization: str | None) -> tuple[str, bool, str, keys.KeyInfo | None]:
        """``who``'s answer and the key itself (its own limits: gateway/tenant_limits.py)."""
        key = await self.key(authorization)
        if key is None:
            return ANONYMOUS, False, "", None
        if key.scope == METRICS:
            raise NotAllowed(f"API key {key.id} is a metrics key: it reads /metrics only. Use a key of scope "
                             "tenant (gpuflow keys create --tenant T) for the API.")
        return key.tenant, True, key.id, key

    async def metrics_reader(self, authorization: str | None) -> None:
        """Whether the caller may read /metrics under --metrics-key-required: NoKey without a valid
        key (none exists yet: nobody), NotAllowed for a key of another scope than METRICS_READERS."""
        key = await self.key(authorization)
        if key is None:
            raise NoKey("/metrics needs an API key (--metrics-key-required) and none exists yet: create one with "
                        "'gpuflow keys create --tenant default --scope metrics'.")
        if key.scope not in METRICS_READERS:
            raise NotAllowed(f"/metrics needs a cluster-admin or metrics key (--metrics-key-required): its series "
                             f"name every tenant; API key {key.id} is a {key.scope} key of tenant {key.tenant}.")

    async def key(self, authorization: str | None) -> keys.KeyInfo | None:
        """The caller's key (its id, tenant, scope); None on an open gateway; NoKey when the
        request must be refused."""
        if not self.required:
            return None
        if not authorization:
            raise NoKey("This gateway needs an API key: send 'Authorization: Bearer KEY'.")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise NoKey("Malformed Authorization header: use 'Bearer KEY'.")
        key = await self.identify(token)
        if key is None:
            raise NoKey("Invalid or revoked API key.")
        return key

    async def identify(self, token: str) -> keys.KeyInfo | None:
        """``token``'s key when it is a valid, unrevoked one, else None; the verdict reused for
        ``cache_s`` (the API and the web console share it)."""
        now = time.monotonic()
        hit = self.cache.get(token)
        if hit is not None and hit[1] > now:
            return hit[0]
        key = await asyncio.to_thread(keys.identify, self.engine, token)
        if len(self.cache) >= MAX_CACHED:
            self.cache.clear()
        self.cache[token] = (key, now + self.cache_s)
        return key
