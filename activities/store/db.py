"""Engine creation. SQLite writers take the database lock at BEGIN (``BEGIN IMMEDIATE``), so a
ledger transaction's read-check-write cannot interleave with another process's; PostgreSQL
transactions lock the worker rows they book against (see ledger.py)."""

from __future__ import annotations

import os

from sqlalchemy import event, inspect, text
from sqlalchemy.exc import DBAPIError
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
    add_new_columns(engine)
    changes.ensure_counter(engine)


def add_new_columns(engine: Engine) -> None:
    """A store made by an older gpuflow lacks the nullable columns added since (create_all makes
    missing tables only): add them, so an upgrade keeps its data. Another process adding the
    same column at the same moment is fine."""
    insp = inspect(engine)
    for table in SQLModel.metadata.sorted_tables:
        if not insp.has_table(table.name):
            continue
        have = {c["name"] for c in insp.get_columns(table.name)}
        for col in table.columns:
            if col.name in have or not col.nullable or col.primary_key:
                continue
            try:
                with engine.begin() as c:
                    c.execute(text(f"ALTER TABLE {table.name} ADD COLUMN {col.name} {col.type.compile(engine.dialect)}"))
            except DBAPIError:
                if col.name not in {c["name"] for c in inspect(engine).get_columns(table.name)}:
                    raise
