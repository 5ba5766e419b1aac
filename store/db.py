"""Engine creation. SQLite writers take the database lock at BEGIN (``BEGIN IMMEDIATE``), so a
ledger transaction's read-check-write cannot interleave with another process's; PostgreSQL
transactions lock the worker rows they book against (see ledger.py).

A read-only caller uses ``reader(engine)``: on SQLite its transactions begin DEFERRED, so in WAL mode
they read a consistent snapshot without the write lock, beside the writers instead of queued
behind them (a decision's snapshot refresh and tenants view, the gateways' routing table). Nothing may
write through it: a deferred transaction that tried to write after another writer committed would
fail with SQLITE_BUSY at once (it cannot wait), which is why writers begin IMMEDIATE."""

from __future__ import annotations

import os
import time
import sqlite3
import threading

from sqlalchemy import event, inspect, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel, create_engine

from store import changes, claims, decision_log, gateway_demand, key_usage, keys, pd_counts, serving, tables, usage  # noqa: F401  (registers the tables)


READ_ONLY = "gpuflow_read_only"


def reader(engine: Engine) -> Engine:
    """``engine`` for read-only transactions (the same pool): see the module's docstring."""
    return engine.execution_options(**{READ_ONLY: True})


def sqlite_url(path: str) -> str:
    return f"sqlite:///{os.path.abspath(path)}"


class _WriterTurns:
    """This process's SQLite writers take turns on a lock before BEGIN IMMEDIATE, and give it back
    once their COMMIT or ROLLBACK has run. Without it they meet at the database lock, where SQLite's
    busy handler makes a waiting writer sleep and poll (1, 2, 5 ... 100 ms between tries), and a
    writer can sleep on past the moment the lock was free. The lock wakes the next writer at once;
    other processes still meet this one at the database lock. (In bursts of 300 placements: 28.6
    and 28.7 placements/s with it; 27.9, and once 15.0 with a stall, without.) One turn per connection, however
    many transactions it begins before it commits (a connection's transaction always ends in
    the dialect's commit or rollback: the pool rolls back a connection returned mid-transaction)."""

    def __init__(self, engine: Engine, wait_s: float = 60.0):
        self._lock = threading.Lock()
        self._held: set[int] = set()  # id() of the DBAPI connections holding the turn
        self._guard = threading.Lock()
        self.wait_s = wait_s
        dialect = engine.dialect
        commit, rollback = dialect.do_commit, dialect.do_rollback

        def do_commit(dbapi_conn):
            try:
                commit(dbapi_conn)
            finally:
                self.give(dbapi_conn)

        def do_rollback(dbapi_conn):
            try:
                rollback(dbapi_conn)
            finally:
                self.give(dbapi_conn)

        dialect.do_commit, dialect.do_rollback = do_commit, do_rollback
        event.listen(engine, "invalidate", lambda dbapi_conn, *_: self.give(dbapi_conn))
        event.listen(engine, "close", lambda dbapi_conn, *_: self.give(dbapi_conn))

    @staticmethod
    def _key(c) -> int:
        return id(getattr(c, "dbapi_connection", c))  # the pool's proxy or the DBAPI connection itself

    def take(self, dbapi_conn) -> None:
        key = self._key(dbapi_conn)
        with self._guard:
            if key in self._held:
                return
        if not self._lock.acquire(timeout=self.wait_s):
            raise sqlite3.OperationalError(f"database is locked: no write turn in {self.wait_s:g} s")
        with self._guard:
            self._held.add(key)

    def give(self, dbapi_conn) -> None:
        key = self._key(dbapi_conn)
        with self._guard:
            if key not in self._held:
                return
            self._held.discard(key)
        self._lock.release()


WAL_TRIES = 300  # x WAL_WAIT_S: how long a new connection waits to put a fresh file in WAL mode


WAL_WAIT_S = 0.1


def _wal(cur) -> None:
    """``PRAGMA journal_mode=WAL``, again while another connection holds the lock it needs. On a
    fresh file two processes both in the middle of the switch deadlock, and SQLite answers one
    "database is locked" at once without its busy handler: ``gpuflow dev`` starting its server and
    gateway on a new data dir lost its control-plane server that way, after saying it was up."""
    for attempt in range(WAL_TRIES):
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or attempt == WAL_TRIES - 1:
                raise
            time.sleep(WAL_WAIT_S)


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
            cur.execute("PRAGMA busy_timeout=60000")
            _wal(cur)
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        turns = _WriterTurns(engine)

        @event.listens_for(engine, "begin")
        def _begin(conn):
            if conn.get_execution_options().get(READ_ONLY):
                conn.exec_driver_sql("BEGIN")
                return
            dbapi_conn = conn.connection.dbapi_connection
            turns.take(dbapi_conn)
            try:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            except BaseException:
                turns.give(dbapi_conn)
                raise

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    args = {"options": f"-csearch_path={schema}"} if schema else {}
    return create_engine(url, connect_args=args, pool_size=10, max_overflow=20, pool_pre_ping=True)


def init_db(engine: Engine) -> None:
    from store import host_credentials

    SQLModel.metadata.create_all(engine)
    add_new_columns(engine)
    changes.ensure_counter(engine)
    host_credentials.ensure_cluster(engine)  # the cluster's keys and join secret, made once


def add_new_columns(engine: Engine) -> None:
    """A store made by an older gpuflow lacks the columns added since (create_all makes missing
    tables only): add the nullable ones and those with a server default (old rows take it), so an
    upgrade keeps its data. Another process adding the same column at the same moment is fine."""
    insp = inspect(engine)
    for table in SQLModel.metadata.sorted_tables:
        if not insp.has_table(table.name):
            continue
        have = {c["name"] for c in insp.get_columns(table.name)}
        for col in table.columns:
            default = col.server_default
            if col.name in have or col.primary_key or not (col.nullable or default is not None):
                continue
            extra = "" if default is None else \
                f" NOT NULL DEFAULT {default.arg.compile(dialect=engine.dialect)}"  # type: ignore[attr-defined]
            try:
                with engine.begin() as c:
                    c.execute(text(f"ALTER TABLE {table.name} ADD COLUMN {col.name} "
                                   f"{col.type.compile(engine.dialect)}{extra}"))
            except DBAPIError:
                if col.name not in {c["name"] for c in inspect(engine).get_columns(table.name)}:
                    raise
