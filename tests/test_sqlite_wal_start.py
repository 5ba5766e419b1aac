"""A new connection to a fresh SQLite store while another process writes its first tables:
SQLite answers the switch to WAL "database is locked" at once, without its busy handler (the
writer holds RESERVED; waiting could deadlock), and ``gpuflow dev`` lost its control-plane server
that way on a new data dir. store/db.py tries the switch again until the writer is done."""

from __future__ import annotations

import sqlite3
import threading
import time

from sqlalchemy import text

from store.db import make_engine


def test_sqlite_itself_refuses_the_switch_at_once_while_a_fresh_file_is_written(tmp_path):
    path = str(tmp_path / "s.db")
    writer = sqlite3.connect(path, timeout=5, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("CREATE TABLE t(x)")
    t0 = time.monotonic()
    try:
        sqlite3.connect(path, timeout=5).execute("PRAGMA journal_mode=WAL")
        raised = False
    except sqlite3.OperationalError as e:
        raised = "locked" in str(e)
    assert raised and time.monotonic() - t0 < 1  # at once: the 5 s busy timeout did not apply
    writer.execute("COMMIT")


def test_a_store_connection_waits_for_the_first_writer_instead(tmp_path):
    path = str(tmp_path / "s.db")
    writer = sqlite3.connect(path, timeout=5, isolation_level=None, check_same_thread=False)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("CREATE TABLE t(x)")
    done = threading.Timer(0.5, lambda: writer.execute("COMMIT"))  # the other process finishes its tables
    done.start()
    t0 = time.monotonic()
    with make_engine(f"sqlite:///{path}").connect() as c:
        assert c.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert c.execute(text("SELECT count(*) FROM t")).scalar() == 0
    assert time.monotonic() - t0 >= 0.4  # it waited for the writer's commit
    done.join()
