"""The gateway's API keys. A key is shown once, when it is created; the store keeps its public
id, its tenant and a salted hash of its secret (HMAC-SHA-256 keyed by a random salt). A key's
secret is 32 random bytes, so a fast hash is enough: nobody guesses 256 bits, and the salt keeps
two stores from sharing hashes.

A key reads ``gpuflow-<id>-<secret>``; the id is the row's primary key, so a lookup reads one
row. Revoked keys stay (revoked_at set) and keep failing.

A key is made where it is asked for (``new_key``: the CLI), and only its id, salt and hash are
sent to the control plane, which stores them (``add``; the cluster workflow's ``create_key``
update): the secret is never in a Temporal history nor in the store.

A key has one scope (contracts/cluster.py ``Scope``: tenant, tenant-admin, cluster-admin,
metrics). A store made before scopes has the ``admin`` column only: its rows read as
``admin_scope(tenant)`` when admin (cluster-admin for tenant default, tenant-admin for any other)
and ``tenant`` otherwise, so an upgrade changes what no key may do. New rows keep ``admin`` set
for the admin scopes, so an older gpuflow reading the store still sees its admins."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import false, func
from sqlalchemy.engine import Engine
from sqlmodel import Field, Session, SQLModel, select

from contracts.cluster import (ADMIN_SCOPES, KEY_NAME, KEY_TENANT, LIMIT_FIELDS, SCOPES, TENANT, KeyAdd, KeyLimitFields,
                               KeyLimits, admin_scope)
from store import tenants
from store.tables import utcnow
from scheduler.errors import InvalidInput

PREFIX = "gpuflow"
TENANT_NAME = re.compile(KEY_TENANT)
NAME = re.compile(KEY_NAME)
KEY = re.compile(r"^gpuflow-([0-9a-f]{12})-([A-Za-z0-9_-]{43})$")


class ApiKeyRow(SQLModel, table=True):
    __tablename__ = "gpuflow_api_keys"
    id: str = Field(primary_key=True)  # public part of the key, 12 hex digits
    tenant: str = Field(index=True)
    name: str = ""
    salt: str = ""
    hash: str = ""  # hex HMAC-SHA-256(salt, secret)
    created_at: datetime = Field(default_factory=utcnow)
    revoked_at: datetime | None = None
    # an admin scope (what a store before scopes had); old stores get the column, false (store/db.py)
    admin: bool = Field(default=False, sa_column_kwargs={"server_default": false()})
    scope: str | None = None  # contracts/cluster.py Scope; None on the rows of a store before scopes
    # its own limits, beside its tenant's (gateway/tenant_limits.py); None: none (every row before them)
    requests_per_s: float | None = None
    tokens_per_min: int | None = None
    max_concurrent: int | None = None


@dataclass(frozen=True)
class KeyInfo:
    id: str
    tenant: str
    name: str
    created_at: datetime
    revoked_at: datetime | None
    scope: str = TENANT
    requests_per_s: float | None = None  # its own limits (None: its tenant's only)
    tokens_per_min: int | None = None
    max_concurrent: int | None = None

    @property
    def admin(self) -> bool:
        return self.scope in ADMIN_SCOPES


def _digest(salt: str, secret: str) -> str:
    return hmac.new(bytes.fromhex(salt), secret.encode(), hashlib.sha256).hexdigest()


def new_key(tenant: str, name: str = "", scope: str = TENANT, limits: KeyLimitFields | None = None) -> tuple[str, KeyAdd]:
    """A new key for ``tenant`` with ``scope``, made here: (the key, to show once; what the store
    keeps of it). Refused, naming the problem, when the tenant, the name or the scope breaks the rule."""
    if scope not in SCOPES:
        raise InvalidInput(f"scope {str(scope)[:40]!r}: use one of {', '.join(SCOPES)}")
    if not TENANT_NAME.match(tenant):
        raise InvalidInput(f"tenant {tenant!r}: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
    if not NAME.match(name):
        raise InvalidInput(f"key name {name[:60]!r}: at most 200 letters, digits, spaces and . , : ; @ / ( ) ' + = # & - _")
    kid, secret, salt = secrets.token_hex(6), secrets.token_urlsafe(32), secrets.token_hex(16)
    return f"{PREFIX}-{kid}-{secret}", KeyAdd(id=kid, tenant=tenant, name=name, salt=salt,
                                              hash=_digest(salt, secret), scope=scope, limits=limits)


def add(engine: Engine, k: KeyAdd) -> KeyInfo:
    """Store a key made by ``new_key``. An id already taken is refused (a key is never replaced)."""
    with Session(engine) as s:
        if s.get(ApiKeyRow, k.id) is not None:
            raise InvalidInput(f"an API key with id {k.id!r} exists already; make a new key")
        scope = k.granted
        row = ApiKeyRow(id=k.id, tenant=k.tenant, name=k.name, salt=k.salt, hash=k.hash, scope=scope,
                        admin=scope in ADMIN_SCOPES, **(k.limits.model_dump() if k.limits else {}))
        s.add(row)
        s.commit()
        s.refresh(row)
        return _info(row)


def add_known(engine: Engine, k: KeyAdd) -> KeyInfo:
    """``add``, for a tenant the tenants file names (``default`` always is); refused otherwise,
    naming the tenant and those that exist (the cluster workflow's ``create_key``, ``keys create
    --data-dir``)."""
    problem = tenants.problem(engine, k.tenant)
    if problem:
        raise InvalidInput(f"no key made: {problem}")
    return add(engine, k)


def create(engine: Engine, tenant: str, name: str = "", scope: str = TENANT,
           limits: KeyLimitFields | None = None) -> tuple[str, KeyInfo]:
    """A new key for ``tenant``, stored here (offline use, tests): (the key, to show once; its
    stored description)."""
    key, k = new_key(tenant, name, scope, limits)
    return key, add(engine, k)


def key_id(key_or_id: str) -> str:
    """The id of a key given whole (``gpuflow-<id>-<secret>``) or by its id: what a revocation
    sends, so the secret of a key revoked by pasting it never leaves this process."""
    m = KEY.match(key_or_id)
    return m.group(1) if m else key_or_id


def scope_of(scope: str | None, admin: bool, tenant: str) -> str:
    """A row's scope: its own; for a row of a store before scopes (None), what its admin flag was."""
    if scope in SCOPES:
        return scope
    return admin_scope(tenant) if admin else TENANT


def _info(r: ApiKeyRow) -> KeyInfo:
    return KeyInfo(id=r.id, tenant=r.tenant, name=r.name, created_at=r.created_at, revoked_at=r.revoked_at,
                   scope=scope_of(r.scope, bool(r.admin), r.tenant), requests_per_s=r.requests_per_s,
                   tokens_per_min=r.tokens_per_min, max_concurrent=r.max_concurrent)


def get(engine: Engine, kid: str) -> KeyInfo | None:
    """The key with id ``kid`` (revoked or not), or None."""
    with Session(engine) as s:
        row = s.get(ApiKeyRow, kid)
        return None if row is None else _info(row)


def list_keys(engine: Engine, offset: int = 0, limit: int | None = None) -> list[KeyInfo]:
    """Keys by tenant, then age; ``offset``/``limit``: one page of them."""
    with Session(engine) as s:
        q = select(ApiKeyRow).order_by(ApiKeyRow.tenant, ApiKeyRow.created_at, ApiKeyRow.id).offset(offset)
        return [_info(r) for r in s.exec(q if limit is None else q.limit(limit))]


def count(engine: Engine) -> int:
    with Session(engine) as s:
        return int(s.exec(select(func.count()).select_from(ApiKeyRow)).one())


def revoke(engine: Engine, key: str) -> KeyInfo:
    """Revoke by id (the 12 hex digits after ``gpuflow-``, or the whole key). Idempotent."""
    kid = key_id(key)
    with Session(engine) as s:
        row = s.get(ApiKeyRow, kid)
        if row is None:
            raise InvalidInput(f"no API key with id {kid!r} (see 'gpuflow keys list')")
        if row.revoked_at is None:
            row.revoked_at = utcnow()
            s.add(row)
            s.commit()
            s.refresh(row)
        return _info(row)


def set_limits(engine: Engine, ask: KeyLimits) -> KeyInfo:
    """``gpuflow keys edit``: the key's limits ``ask`` gives are set, those it clears removed, the
    rest kept; gateways apply them within their key cache (``key_cache_s``). A revoked key is refused."""
    with Session(engine) as s:
        row = s.get(ApiKeyRow, ask.id)
        if row is None:
            raise InvalidInput(f"no API key with id {ask.id!r} (see 'gpuflow keys list')")
        if row.revoked_at is not None:
            raise InvalidInput(f"API key {ask.id} is revoked: its limits no longer matter")
        for f in LIMIT_FIELDS:
            if f in ask.clear:
                setattr(row, f, None)
            elif getattr(ask, f) is not None:
                setattr(row, f, getattr(ask, f))
        s.add(row)
        s.commit()
        s.refresh(row)
        return _info(row)


def identify(engine: Engine, token: str) -> KeyInfo | None:
    """The record of a valid, unrevoked key ``token``; None for anything else (malformed, unknown,
    revoked, a wrong secret). The secret is compared in constant time."""
    m = KEY.match(token)
    if not m:
        return None
    with Session(engine) as s:
        row = s.get(ApiKeyRow, m.group(1))
    if row is None or row.revoked_at is not None:
        return None
    return _info(row) if hmac.compare_digest(row.hash, _digest(row.salt, m.group(2))) else None


def tenant_of(engine: Engine, key: str) -> str | None:
    """The tenant of a valid, unrevoked ``key``; None for anything else."""
    info = identify(engine, key)
    return info.tenant if info else None


def any_key(engine: Engine) -> bool:
    """Whether a key was ever created (revoked ones count: revoking every key must not reopen a
    gateway)."""
    with Session(engine) as s:
        return bool(s.exec(select(func.count()).select_from(ApiKeyRow)).one())
