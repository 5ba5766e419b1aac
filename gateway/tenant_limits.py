"""Per-tenant admission at the gateway, from the tenants file (``requests_per_s``,
``max_concurrent``, ``priority``). Pure: the caller passes ``now`` (monotonic seconds); a single
event loop owns it, so no locks.

- **Requests per second** is a token bucket per tenant: it holds at most
  ``burst = max(1, requests_per_s)`` tokens, gains ``requests_per_s`` a second, and each admitted
  request takes one. A request that finds less than one token is refused; it could be admitted
  ``(1 - tokens) / requests_per_s`` seconds later (the ``Retry-After``, rounded up). So a tenant
  idle for a while may send one second's worth at once, and ``requests_per_s`` a second after that
  (Envoy's local rate limit with ``max_tokens = tokens_per_fill``).
- **Concurrent requests** count a request from its admission until its response has ended
  (streams included, waiting in a model's queue included). One more is refused with
  ``Retry-After: 1``: nobody knows when a stream ends.
- Both are checked before either is taken: a refused request costs the tenant nothing. The gateway
  checks (``check``) before it reads a request's body and admits once the body has arrived, so a
  body that is slow or never ends holds no slot.
- Requests of an open gateway (no API key exists; ``gateway.auth.ANONYMOUS``) belong to tenant
  ``default``. A tenant the file does not name (a key made for it before the file did) has no
  limits and priority 0, like ``default`` when the file does not name it.
- A new file keeps a tenant's bucket while its ``requests_per_s`` is unchanged (a re-read of the
  same file refills nothing) and starts a changed one full. Requests in flight stay counted."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.auth import ANONYMOUS

DEFAULT = "default"
REQUESTS_PER_S, MAX_CONCURRENT = "requests_per_s", "max_concurrent"


@dataclass(frozen=True)
class Rule:
    priority: int = 0
    requests_per_s: float | None = None
    max_concurrent: int | None = None


NO_RULE = Rule()


@dataclass(frozen=True)
class Refusal:
    tenant: str
    reason: str  # REQUESTS_PER_S or MAX_CONCURRENT
    limit: float
    retry_after_s: float

    @property
    def message(self) -> str:
        if self.reason == REQUESTS_PER_S:
            return (f"Tenant {self.tenant!r} is over its limit of {self.limit:g} requests per second "
                    f"(requests_per_s in the tenants file); retry in {math.ceil(self.retry_after_s)} s.")
        return (f"Tenant {self.tenant!r} already has {self.limit:g} requests in flight, its limit "
                f"(max_concurrent in the tenants file); retry when one of them has ended.")


def rules_of(tenants_file) -> dict[str, Rule]:
    """The gateway's part of a ``scheduler.tenancy.config.TenantsFile``."""
    return {t.name: Rule(t.priority, t.requests_per_s, t.max_concurrent) for t in tenants_file.tenants}


def subject(tenant: str) -> str:
    """The tenants file's name for a request's tenant (an open gateway's requests are ``default``)."""
    return DEFAULT if tenant == ANONYMOUS else tenant


@dataclass
class Bucket:
    rate: float
    tokens: float
    at: float

    @property
    def burst(self) -> float:
        return max(1.0, self.rate)

    def fill(self, now: float) -> None:
        if now > self.at:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
            self.at = now


class Limits:
    def __init__(self, rules: dict[str, Rule] | None = None, now: float = 0.0):
        self.rules: dict[str, Rule] = {}
        self.buckets: dict[str, Bucket] = {}
        self.active: dict[str, int] = {}  # tenant -> requests admitted and not yet ended
        self.set_rules(rules or {}, now)

    def set_rules(self, rules: dict[str, Rule], now: float) -> None:
        old = self.buckets
        self.rules, self.buckets = dict(rules), {}
        for name, r in self.rules.items():
            if r.requests_per_s is None:
                continue
            b = old.get(name)
            self.buckets[name] = b if b is not None and b.rate == r.requests_per_s else \
                Bucket(r.requests_per_s, max(1.0, r.requests_per_s), now)

    def rule(self, tenant: str) -> Rule:
        return self.rules.get(subject(tenant), NO_RULE)

    def priority(self, tenant: str) -> int:
        return self.rule(tenant).priority

    def check(self, tenant: str, now: float) -> Refusal | None:
        """Why ``admit`` would refuse the request now, or None; takes nothing (the gateway asks
        before it reads a body, and admits once the body has arrived)."""
        name = subject(tenant)
        r = self.rules.get(name, NO_RULE)
        if r.max_concurrent is not None and self.active.get(name, 0) >= r.max_concurrent:
            return Refusal(name, MAX_CONCURRENT, r.max_concurrent, 1.0)
        b = self.buckets.get(name)
        if b is not None:
            b.fill(now)
            if b.tokens < 1.0:
                return Refusal(name, REQUESTS_PER_S, b.rate, (1.0 - b.tokens) / b.rate)
        return None

    def admit(self, tenant: str, now: float) -> Refusal | None:
        """None, and the request is counted (``done`` ends it); or why it is refused."""
        refused = self.check(tenant, now)
        if refused is None:
            name = subject(tenant)
            b = self.buckets.get(name)
            if b is not None:
                b.tokens -= 1.0
            self.active[name] = self.active.get(name, 0) + 1
        return refused

    def done(self, tenant: str) -> None:
        name = subject(tenant)
        n = self.active.get(name, 0) - 1
        if n > 0:
            self.active[name] = n
        else:
            self.active.pop(name, None)
