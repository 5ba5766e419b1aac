"""Store fixtures: a fresh SQLite file, and a fresh schema in the machine's PostgreSQL
(GPUFLOW_TEST_POSTGRES_URL, default postgresql://postgres@127.0.0.1:5432/test)."""

from __future__ import annotations

import os
import uuid

import pytest
from sqlalchemy import text

from store import db, records

PG_URL = os.environ.get("GPUFLOW_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def pg_schema():
    """Create a throwaway schema; returns (url, schema, drop)."""
    schema = "gpuflow_t_" + uuid.uuid4().hex[:10]
    admin = db.make_engine(PG_URL)
    with admin.begin() as c:
        c.execute(text(f'CREATE SCHEMA "{schema}"'))

    def drop():
        with admin.begin() as c:
            c.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()

    return schema, drop


@pytest.fixture
def sqlite_engine(tmp_path):
    """An engine on a fresh, initialised SQLite store (for what is about SQLite itself, or needs
    no second dialect)."""
    engine = db.make_engine(db.sqlite_url(str(tmp_path / "gpuflow.db")))
    db.init_db(engine)
    yield engine
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    """(url, schema, engine) for a fresh, initialised store of each kind."""
    if request.param == "sqlite":
        url = db.sqlite_url(str(tmp_path / "gpuflow.db"))
        engine = db.make_engine(url)
        db.init_db(engine)
        yield url, None, engine
        engine.dispose()
        return
    schema, drop = pg_schema()
    engine = db.make_engine(PG_URL, schema=schema)
    db.init_db(engine)
    yield PG_URL, schema, engine
    engine.dispose()
    drop()


def want(engine, *names: str, spec: dict | None = None) -> None:
    """Replicas their deployment started (records.create_instances: wanted), each under an active
    deployment named by its prefix (``a`` for ``a-0``; made when missing, with ``spec``): only such
    replicas are booked (store/ledger.py wanted_problem)."""
    from contracts.control import InstanceRecord

    for d in sorted({n.rsplit("-", 1)[0] for n in names}):
        if not _has_deployment(engine, d):
            records.save_deployment(engine, d, {"name": d, **(spec or {})}, 1)
    records.create_instances(engine, [InstanceRecord(name=n, deployment=n.rsplit("-", 1)[0],
                                                     model=n.rsplit("-", 1)[0], state="pending") for n in names])


def stored_spec(source: str, backend: str = "vllm", params: str = "", **extra) -> dict:
    """A deployment's spec as the store keeps it, from a source key (``huggingface:org/repo``): what
    its replicas' learned-claim fingerprints are made of (store/claims.py)."""
    hub, repo = source.split(":", 1)
    return {"source": {hub: {"repo": repo}}, "backend": backend, "backend_parameters": params.split(), **extra}


def on(engine, host: str, *names: str) -> None:
    """The store places these replicas on ``host`` (as their booking writes it)."""
    from sqlmodel import Session

    from store.tables import InstanceRow

    with Session(engine) as s:
        for n in names:
            row = s.get(InstanceRow, n)
            row.worker = host
            s.add(row)
        s.commit()


def _has_deployment(engine, name: str) -> bool:
    from sqlmodel import Session

    from store.tables import DeploymentRow

    with Session(engine) as s:
        return s.get(DeploymentRow, name) is not None
