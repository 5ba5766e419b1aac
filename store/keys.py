"""The gateway's API keys. A key is shown once, when it is created; the store keeps its public
id, its tenant and a salted hash of its secret (HMAC-SHA-256 keyed by a random salt). A key's
secret is 32 random bytes, so a fast hash is enough: nobody guesses 256 bits, and the salt keeps
two stores from sharing hashes.

A key reads ``gpuflow-<id>-<secret>``; the id is the row's primary key, so a lookup reads one
row. Revoked keys stay (revoked_at set) and keep failing."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func
from sqlalchemy.engine import Engine
from sqlmodel import Field, Session, SQLModel, select

from store.tables import utcnow
from scheduler.errors import InvalidInput

PREFIX = "gpuflow"
TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
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


@dataclass(frozen=True)
class KeyInfo:
    id: str
    tenant: str
    name: str
    created_at: datetime
    revoked_at: datetime | None


def _digest(salt: str, secret: str) -> str:
    return hmac.new(bytes.fromhex(salt), secret.encode(), hashlib.sha256).hexdigest()


def create(engine: Engine, tenant: str, name: str = "") -> tuple[str, KeyInfo]:
    """A new key for ``tenant``: (the key, to show once; its stored description)."""
    if not TENANT.match(tenant):
        raise InvalidInput(f"tenant {tenant!r}: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
    if len(name) > 200:
        raise InvalidInput("key name: at most 200 characters")
    kid, secret, salt = secrets.token_hex(6), secrets.token_urlsafe(32), secrets.token_hex(16)
    row = ApiKeyRow(id=kid, tenant=tenant, name=name, salt=salt, hash=_digest(salt, secret))
    with Session(engine) as s:
        s.add(row)
        s.commit()
        s.refresh(row)
        return f"{PREFIX}-{kid}-{secret}", _info(row)


def _info(r: ApiKeyRow) -> KeyInfo:
    return KeyInfo(id=r.id, tenant=r.tenant, name=r.name, created_at=r.created_at, revoked_at=r.revoked_at)


def list_keys(engine: Engine) -> list[KeyInfo]:
    with Session(engine) as s:
        return [_info(r) for r in s.exec(select(ApiKeyRow).order_by(ApiKeyRow.tenant, ApiKeyRow.created_at))]


def revoke(engine: Engine, key_id: str) -> KeyInfo:
    """Revoke by id (the 12 hex digits after ``gpuflow-``, or the whole key). Idempotent."""
    m = KEY.match(key_id)
    kid = m.group(1) if m else key_id
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


def tenant_of(engine: Engine, key: str) -> str | None:
    """The tenant of a valid, unrevoked ``key``; None for anything else."""
    m = KEY.match(key)
    if not m:
        return None
    with Session(engine) as s:
        row = s.get(ApiKeyRow, m.group(1))
    if row is None or row.revoked_at is not None:
        return None
    return row.tenant if hmac.compare_digest(row.hash, _digest(row.salt, m.group(2))) else None


def any_key(engine: Engine) -> bool:
    """Whether a key was ever created (revoked ones count: revoking every key must not reopen a
    gateway)."""
    with Session(engine) as s:
        return bool(s.exec(select(func.count()).select_from(ApiKeyRow)).one())
