"""The gateway's API keys in the store, on SQLite and PostgreSQL: shown once, kept as a salted
hash, revoked for good."""

from __future__ import annotations

import pytest
from sqlmodel import Session, select

from store import keys
from scheduler.errors import InvalidInput


def test_keys_are_stored_hashed_checked_and_revoked(store):
    _, _, engine = store
    assert keys.any_key(engine) is False
    key, info = keys.create(engine, "team-a", "ci")
    other, _ = keys.create(engine, "team-a")
    assert key != other and key.startswith(f"gpuflow-{info.id}-")
    with Session(engine) as s:
        row = s.exec(select(keys.ApiKeyRow).where(keys.ApiKeyRow.id == info.id)).one()
    secret = key.split("-", 2)[2]  # gpuflow-ID-SECRET (the secret may hold "-")
    assert secret not in (row.hash, row.salt) and len(row.hash) == 64  # only a salted HMAC-SHA-256
    assert keys.tenant_of(engine, key) == "team-a"
    assert keys.tenant_of(engine, key[:-1] + ("A" if key[-1] != "A" else "B")) is None  # tampered secret
    assert keys.tenant_of(engine, "sk-not-ours") is None
    assert keys.revoke(engine, info.id).revoked_at is not None
    assert keys.tenant_of(engine, key) is None and keys.tenant_of(engine, other) == "team-a"
    assert keys.revoke(engine, key).revoked_at is not None  # by the whole key, again: idempotent
    assert [k.id for k in keys.list_keys(engine)].count(info.id) == 1
    assert keys.any_key(engine) is True


@pytest.mark.parametrize("tenant", ["", "-a", "a b", "x" * 65, "a/b"])
def test_tenant_names_are_checked(store, tenant):
    _, _, engine = store
    with pytest.raises(InvalidInput):
        keys.create(engine, tenant)


def test_revoking_an_unknown_key_says_so(store):
    _, _, engine = store
    with pytest.raises(InvalidInput, match="no API key"):
        keys.revoke(engine, "000000000000")
