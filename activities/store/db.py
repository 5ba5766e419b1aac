"""Engine creation. SQLite writers take the database lock at BEGIN (``BEGIN IMMEDIATE``), so a
ledger transaction's read-check-write cannot interleave with another process's; PostgreSQL
transactions lock the worker rows they book against (see ledger.py)."""

from __future__ import annotations

import os

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel, create_engine

from activities.store import changes, keys, serving, tables  # noqa: F401  (registers the tables)


def sqlite_url(path: str) -> str:
    return f"sqlite:///{os.path.abspath(path)}"


def make_engine(url: str, schema: str | None = None) -> Engine:
    """An engine for ``url``; ``schema`` (PostgreSQL) puts gpuflow's tables in their own schema."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 60})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _):
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=60000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn):
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    args = {"options": f"-csearch_path={schema}"} if schema else {}
    return create_engine(url, connect_args=args, pool_size=10, max_overflow=20, pool_pre_ping=True)


def init_db(engine: Engine) -> None:
    SQLModel.metadata.create_all(engine)
    changes.ensure_counter(engine)
