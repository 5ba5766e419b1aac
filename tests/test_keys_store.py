"""The gateway's API keys in the store, on SQLite and PostgreSQL: shown once, kept as a salted
hash, revoked for good; one scope each (an old store's admin keys read as the scope they meant),
for a tenant that exists."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlmodel import Session, select

from scheduler.errors import InvalidInput
from scheduler.tenancy.config import TenantsFile
from store import db, keys, tenants


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


@pytest.mark.parametrize("scope", ["tenant", "tenant-admin", "cluster-admin", "metrics"])
def test_a_key_keeps_its_scope(store, scope):
    _, _, engine = store
    key, info = keys.create(engine, "team-a", scope=scope)
    got = keys.identify(engine, key)
    assert (info.scope, got.scope, keys.get(engine, info.id).scope) == (scope, scope, scope)
    assert got.admin == (scope in ("tenant-admin", "cluster-admin"))  # what an older reader of the row sees
    with Session(engine) as s:
        assert s.get(keys.ApiKeyRow, info.id).admin == got.admin


@pytest.mark.parametrize("scope", ["admin", "root", "", "Cluster-Admin", True])
def test_a_scope_outside_the_four_is_refused_by_the_client(scope):
    with pytest.raises(InvalidInput, match="scope .*: use one of tenant, tenant-admin, cluster-admin, metrics"):
        keys.new_key("team-a", "", scope)


@pytest.mark.parametrize("tenant, admin, want", [
    ("default", True, "cluster-admin"),  # an admin key of the operator's own tenant: everything, as before
    ("team-a", True, "tenant-admin"),  # another tenant's admin key: its own tenant's deployments and keys
    ("default", False, "tenant"),
    ("team-a", False, "tenant"),
])
def test_an_old_store_reads_its_admin_keys_as_scopes(tmp_path, tenant, admin, want):
    """A store made before scopes has no scope column: init_db adds it (NULL on old rows), and
    each old row reads as its admin flag meant."""
    engine = db.make_engine(db.sqlite_url(str(tmp_path / "old.db")))
    db.init_db(engine)
    key, info = keys.create(engine, tenant)
    with engine.begin() as c:
        c.execute(text("ALTER TABLE gpuflow_api_keys DROP COLUMN scope"))
        c.execute(text("UPDATE gpuflow_api_keys SET admin = :a"), {"a": admin})
    db.init_db(engine)
    assert keys.identify(engine, key).scope == want
    assert keys.list_keys(engine)[0].scope == want


def test_a_store_before_admin_keys_too(tmp_path):
    engine = db.make_engine(db.sqlite_url(str(tmp_path / "older.db")))
    db.init_db(engine)
    key, _ = keys.create(engine, "default")
    with engine.begin() as c:
        c.execute(text("ALTER TABLE gpuflow_api_keys DROP COLUMN scope"))
        c.execute(text("ALTER TABLE gpuflow_api_keys DROP COLUMN admin"))
    db.init_db(engine)
    assert keys.identify(engine, key).scope == "tenant"  # no admin column: no admin
    later, _ = keys.create(engine, "default", scope="metrics")
    assert keys.identify(engine, later).scope == "metrics"


def test_a_key_for_a_tenant_that_does_not_exist_is_refused_naming_those_that_do(store):
    _, _, engine = store
    _, made = keys.new_key("team-x")
    with pytest.raises(InvalidInput, match=r"no key made: tenant 'team-x' is not in the tenants file \(known: default\)"):
        keys.add_known(engine, made)
    tenants.apply(engine, TenantsFile.model_validate({"tenants": [{"name": "team-a"}, {"name": "team-b"}]}))
    with pytest.raises(InvalidInput, match=r"tenant 'team-x' is not in the tenants file \(known: default, team-a, team-b\)"):
        keys.add_known(engine, made)
    assert keys.count(engine) == 0  # nothing stored
    for t in ("default", "team-b"):  # default always exists
        assert keys.add_known(engine, keys.new_key(t)[1]).tenant == t
