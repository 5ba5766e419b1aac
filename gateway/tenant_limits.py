"""Admission at the gateway: a tenant's limits from the tenants file (``requests_per_s``,
``tokens_per_min``, ``max_concurrent``, ``priority``) and an API key's own (``gpuflow keys create
--requests-per-s ...``, ``keys edit``). Pure: the caller passes ``now`` (monotonic seconds); a
single event loop owns it, so no locks.

Each limit holds across every gateway of the cluster: this gateway enforces its *share*
(gateway/limit_shares.py), from the demand every live gateway reports in the store (the refresh
loop hands it in with ``set_shares``). Alone, a gateway's share is the whole limit.

- **Requests per second** is a token bucket per subject (a tenant, a key): with this gateway's
  rate ``r = requests_per_s * share`` it holds at most ``burst = max(1, r)`` tokens, gains ``r`` a
  second, and each admitted request takes one. A request that finds less than one token is
  refused; it could be admitted ``(1 - tokens) / r`` seconds later (the ``Retry-After``, rounded up).
- **Tokens per minute** is a bucket of ``tokens_per_min * share`` tokens that refills at that
  much a minute. A request is admitted while it holds any; its answer's tokens (``usage``) are
  taken when it ends (``spend``), so one answer may take it below zero, and the next waits.
- **Concurrent requests** count a request from its admission until its response has ended
  (streams included, waiting in a model's queue included). This gateway may hold its part of
  ``max_concurrent`` (limit_shares.allot); one more is refused with ``Retry-After: 1``.
- A key's limits are checked before its tenant's, and every limit before any is taken: a refused
  request costs nothing. The gateway checks (``check``) before it reads a request's body and
  admits once the body has arrived, so a body that is slow or never ends holds no slot.
- Requests of an open gateway (no API key exists; ``gateway.auth.ANONYMOUS``) belong to tenant
  ``default``. A tenant the file does not name has no limits and priority 0.
- A new file (or a key's new limits) keeps a subject's buckets while its limit is unchanged and
  starts a changed one full. Requests in flight stay counted."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway import limit_shares
from gateway.auth import ANONYMOUS

DEFAULT = "default"
REQUESTS_PER_S, TOKENS_PER_MIN, MAX_CONCURRENT = "requests_per_s", "tokens_per_min", "max_concurrent"
TENANT, KEY = "tenant", "key"  # a limit's scope: the tenants file's, or an API key's own
SMOOTH = 0.5  # a subject's demand: this much of the last refresh's rate, the rest of the demand before
MAX_SUBJECTS = 10_000  # reported to the store at most (the busiest)


@dataclass(frozen=True)
class Rule:
    priority: int = 0
    requests_per_s: float | None = None
    max_concurrent: int | None = None
    tokens_per_min: int | None = None

    @property
    def limited(self) -> bool:
        return any(x is not None for x in (self.requests_per_s, self.max_concurrent, self.tokens_per_min))


NO_RULE = Rule()
WHERE = {TENANT: "in the tenants file", KEY: "of the API key: gpuflow keys edit"}


@dataclass(frozen=True)
class Refusal:
    tenant: str
    reason: str  # REQUESTS_PER_S, TOKENS_PER_MIN or MAX_CONCURRENT
    limit: float  # the cluster's (every gateway's together)
    retry_after_s: float
    scope: str = TENANT  # TENANT or KEY
    name: str = ""  # the tenant, or the key's id

    @property
    def message(self) -> str:
        who = f"Tenant {self.tenant!r}" if self.scope == TENANT else f"API key {self.name} (tenant {self.tenant!r})"
        where = f"{self.reason} {WHERE[self.scope]}"
        if self.reason == REQUESTS_PER_S:
            return (f"{who} is over its limit of {self.limit:g} requests per second ({where}); "
                    f"retry in {math.ceil(self.retry_after_s)} s.")
        if self.reason == TOKENS_PER_MIN:
            return (f"{who} is over its limit of {self.limit:g} tokens per minute ({where}); "
                    f"retry in {math.ceil(self.retry_after_s)} s.")
        return (f"{who} already has {self.limit:g} requests in flight, its limit ({where}); "
                f"retry when one of them has ended.")


def rules_of(tenants_file) -> dict[str, Rule]:
    """The gateway's part of a ``scheduler.tenancy.config.TenantsFile``."""
    return {t.name: Rule(t.priority, t.requests_per_s, t.max_concurrent, getattr(t, "tokens_per_min", None))
            for t in tenants_file.tenants}


def key_rule(key) -> Rule | None:
    """An API key's own limits (store/keys.py KeyInfo), or None (no key, or none set)."""
    if key is None:
        return None
    r = Rule(0, getattr(key, "requests_per_s", None), getattr(key, "max_concurrent", None),
             getattr(key, "tokens_per_min", None))
    return r if r.limited else None


def subject(tenant: str) -> str:
    """The tenants file's name for a request's tenant (an open gateway's requests are ``default``)."""
    return DEFAULT if tenant == ANONYMOUS else tenant


@dataclass
class Bucket:
    rate: float  # tokens a second
    burst: float
    tokens: float
    at: float

    def fill(self, now: float) -> None:
        if now > self.at:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
            self.at = now

    def resize(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = min(self.tokens, burst)


@dataclass
class Subject:
    """One limited subject's state on this gateway: its rule, buckets, requests in flight, demand."""
    rule: Rule
    limits: tuple  # (requests_per_s, tokens_per_min): its buckets start full when these change
    requests: Bucket | None = None
    tokens: Bucket | None = None
    active: int = 0
    asked: int = 0  # requests asked for since the last report
    demand: float = 0.0
    allowed: int | None = None  # this gateway's part of max_concurrent (limit_shares.allot)


MAX_WAIT_S = 600.0  # a refusal's Retry-After at most (a share of 0 refills never)
DEBT_MIN = 10.0  # an answer's tokens take a bucket at most this many minutes of its limit below 0


def wait_s(b: Bucket) -> float:
    """Until ``b`` holds a whole token again, in seconds (MAX_WAIT_S when it does not refill)."""
    return min(MAX_WAIT_S, (1.0 - b.tokens) / b.rate) if b.rate > 0 else MAX_WAIT_S


def request_bucket(limit: float, share: float, now: float, old: Bucket | None = None) -> Bucket:
    rate = limit * share
    if old is not None:
        old.resize(rate, max(1.0, rate))
        return old
    return Bucket(rate, max(1.0, rate), max(1.0, rate), now)


def token_bucket(limit: float, share: float, now: float, old: Bucket | None = None) -> Bucket:
    per_min = limit * share
    if old is not None:
        old.resize(per_min / 60.0, per_min)
        return old
    return Bucket(per_min / 60.0, per_min, per_min, now)


def sid(scope: str, name: str) -> str:
    """A subject's id, as gateways report it in the store: ``tenant:NAME`` or ``key:ID``."""
    return f"{scope}:{name}"


class Limits:
    def __init__(self, rules: dict[str, Rule] | None = None, now: float = 0.0, me: str = ""):
        """``me``: this gateway's id (its row among the live gateways' demand)."""
        self.me = me
        self.rules: dict[str, Rule] = {}
        self.subjects: dict[str, Subject] = {}
        self.rows: dict[str, dict[str, float]] = {}  # live gateway -> subject -> demand, as last read
        self.set_rules(rules or {}, now)

    # --- rules and shares ------------------------------------------------------------------------
    def set_rules(self, rules: dict[str, Rule], now: float) -> None:
        """The tenants file's rules (a tenant it no longer names keeps only its requests in flight)."""
        self.rules = dict(rules)
        for name, r in self.rules.items():
            self._set(sid(TENANT, name), r, now)
        for k, s in list(self.subjects.items()):
            if k.startswith(TENANT + ":") and k[len(TENANT) + 1:] not in self.rules:
                self._set(k, NO_RULE, now)

    def key_rule(self, key_id: str, rule: Rule | None, now: float) -> None:
        """An API key's own limits, as its record says now (the gateway's key cache)."""
        k = sid(KEY, key_id)
        if key_id and (k in self.subjects or (rule is not None and rule.limited)):
            self._set(k, rule or NO_RULE, now)

    def _set(self, k: str, rule: Rule, now: float) -> None:
        s = self.subjects.get(k)
        limits = (rule.requests_per_s, rule.tokens_per_min)
        if s is None:
            if not rule.limited:
                return
            s = self.subjects[k] = Subject(rule, limits)
            fresh = True
        elif s.rule == rule:
            return  # a key's limits, told again with each of its requests: nothing to redo
        else:
            fresh, s.rule, s.limits = s.limits != limits, rule, limits
        self._size(k, s, now, fresh)

    def _size(self, k: str, s: Subject, now: float, fresh: bool) -> None:
        demands = self.demands_of(k)
        share = limit_shares.fraction(self.me, demands)
        r = s.rule
        s.requests = None if r.requests_per_s is None else \
            request_bucket(r.requests_per_s, share, now, None if fresh else s.requests)
        s.tokens = None if r.tokens_per_min is None else \
            token_bucket(r.tokens_per_min, share, now, None if fresh else s.tokens)
        s.allowed = None if r.max_concurrent is None else limit_shares.allot(r.max_concurrent, self.me, demands)

    def demands_of(self, k: str) -> dict[str, float]:
        return {g: row.get(k, 0.0) for g, row in self.rows.items()}

    def set_shares(self, rows: dict[str, dict[str, float]], now: float) -> None:
        """Every live gateway's demand per subject (this one's row included), read from the store:
        each subject's buckets and concurrency take this gateway's new share."""
        self.rows = {g: dict(r) for g, r in rows.items()}
        for k, s in self.subjects.items():
            self._size(k, s, now, False)

    def share(self, scope: str, name: str) -> float:
        """This gateway's share (0..1) of a subject's limits now."""
        return limit_shares.fraction(self.me, self.demands_of(sid(scope, name)))

    def demand(self, dt: float) -> dict[str, float]:
        """What this gateway reports for the last ``dt`` seconds: per limited subject, the requests
        a second it was asked for (smoothed) plus those in flight; the busiest MAX_SUBJECTS."""
        out = {}
        for k, s in self.subjects.items():
            rate = s.asked / dt if dt > 0 else 0.0
            s.demand, s.asked = SMOOTH * rate + (1 - SMOOTH) * s.demand, 0
            d = s.demand + s.active
            if d >= 0.01 and s.rule.limited:
                out[k] = round(d, 3)
        return dict(sorted(out.items(), key=lambda kv: -kv[1])[:MAX_SUBJECTS])

    # --- admission ---------------------------------------------------------------------------------
    def rule(self, tenant: str) -> Rule:
        return self.rules.get(subject(tenant), NO_RULE)

    def priority(self, tenant: str) -> int:
        return self.rule(tenant).priority

    def _mine(self, tenant: str, key_id: str) -> list[tuple[str, str, Subject]]:
        """The subjects a request counts against: its key's (when it has limits), then its tenant's."""
        got = []
        for scope, name in ((KEY, key_id), (TENANT, subject(tenant))):
            s = self.subjects.get(sid(scope, name)) if name else None
            if s is not None:
                got.append((scope, name, s))
        return got

    def _verdict(self, tenant: str, key_id: str, now: float) -> Refusal | None:
        t = subject(tenant)
        for scope, name, s in self._mine(tenant, key_id):
            r = s.rule
            if r.max_concurrent is not None and s.active >= s.allowed:
                return Refusal(t, MAX_CONCURRENT, r.max_concurrent, 1.0, scope, name)
            b = s.requests
            if b is not None:
                b.fill(now)
                if b.tokens < 1.0:
                    return Refusal(t, REQUESTS_PER_S, r.requests_per_s, wait_s(b), scope, name)
            b = s.tokens
            if b is not None:
                b.fill(now)
                if b.tokens <= 0.0:
                    return Refusal(t, TOKENS_PER_MIN, r.tokens_per_min, wait_s(b), scope, name)
        return None

    def check(self, tenant: str, now: float, key_id: str = "", key_rule: Rule | None = None) -> Refusal | None:
        """Why ``admit`` would refuse the request now, or None; takes nothing (the gateway asks
        before it reads a body, and admits once the body has arrived). A refusal counts as demand."""
        self.key_rule(key_id, key_rule, now)
        refused = self._verdict(tenant, key_id, now)
        if refused is not None:
            for _, _, s in self._mine(tenant, key_id):
                s.asked += 1
        return refused

    def admit(self, tenant: str, now: float, key_id: str = "", key_rule: Rule | None = None) -> Refusal | None:
        """None, and the request is counted (``done`` ends it); or why it is refused."""
        self.key_rule(key_id, key_rule, now)
        refused = self._verdict(tenant, key_id, now)
        for _, _, s in self._mine(tenant, key_id):
            s.asked += 1
            if refused is None:
                if s.requests is not None:
                    s.requests.tokens -= 1.0
                s.active += 1
        return refused

    def done(self, tenant: str, key_id: str = "") -> None:
        for _, _, s in self._mine(tenant, key_id):
            s.active = max(0, s.active - 1)

    def spend(self, tenant: str, key_id: str, tokens: int) -> None:
        """An answer's tokens (its ``usage``), taken from the tokens_per_min buckets it counts against."""
        if tokens > 0:
            for _, _, s in self._mine(tenant, key_id):
                if s.tokens is not None:  # engine-reported: a debt of at most DEBT_MIN minutes
                    s.tokens.tokens = max(-DEBT_MIN * s.tokens.burst, s.tokens.tokens - tokens)
