"""SQLite writers of one process take turns (store/db.py: _WriterTurns), and read-only
transactions (db.reader) go beside them: on a real SQLite file, with real threads."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlmodel import Session, select

from contracts.control import InstanceRecord
from store import db, ledger, records
from store.tables import InstanceRow
from tests.store_fixtures import want


@pytest.fixture
def engine(sqlite_engine):
    return sqlite_engine


def rec(name: str, state: str) -> InstanceRecord:
    return InstanceRecord(name=name, deployment="m", model="m", state=state)


def write_soon(engine, name: str, within_s: float = 5.0) -> float:
    """Seconds a write from another thread took; fails if it waited past ``within_s``."""
    t = time.monotonic()
    with ThreadPoolExecutor(1) as ex:
        ex.submit(records.record_instance, engine, rec(name, "pending")).result(timeout=within_s)
    return time.monotonic() - t


def test_many_threads_write_without_locked_errors(engine):
    # 8 threads x 40 writes, each thread to its own rows: every write lands, none meets "database is locked"
    def work(k: int) -> None:
        for i in range(40):
            records.record_instance(engine, rec(f"m-{k}-{i % 5}", ["pending", "starting", "running"][i % 3]))

    with ThreadPoolExecutor(8) as ex:
        for f in [ex.submit(work, k) for k in range(8)]:
            f.result(timeout=60)
    rows = records.instances_of(engine)
    assert len(rows) == 8 * 5
    # write i = 35..39 is the last of row i % 5; its state is i % 3: 35->2 running, 36->0, 37->1, 38->2, 39->0
    assert {r.name.rsplit("-", 1)[1]: r.state for r in rows if r.name.startswith("m-0-")} == {
        "0": "running", "1": "pending", "2": "starting", "3": "running", "4": "pending"}


@pytest.mark.parametrize("how", ["exception", "closed without commit", "rollback"])
def test_every_way_a_write_ends_gives_the_turn_back(engine, how):
    want(engine, "m-0")
    records.record_instance(engine, rec("m-0", "pending"))
    if how == "exception":  # the ledger refuses a plan (nothing written): its transaction rolls back
        with pytest.raises(ledger.StaleDecision):
            ledger.reserve(engine, "m-0", ledger.PlacementPlan(worker="nowhere", gpu_indexes=[0],
                                                               claim={"vram": {0: 1}, "ram": 1}))
    else:
        s = Session(engine)
        row = s.get(InstanceRow, "m-0")  # a write transaction has begun: the turn is taken
        row.state = "error"
        s.add(row)
        s.flush()
        if how == "rollback":
            s.rollback()
        s.close()
    assert write_soon(engine, "m-1") < 5
    assert records.instances_of(engine)[0].state == "pending"  # nothing of the abandoned write stayed


def test_a_reader_reads_while_a_writer_holds_the_database(engine):
    records.record_instance(engine, rec("m-0", "pending"))
    held, done = threading.Event(), threading.Event()

    def writer():
        with Session(engine) as s:
            row = s.get(InstanceRow, "m-0")
            row.state = "running"
            s.add(row)
            s.flush()  # the write lock is held from here to the commit
            held.set()
            done.wait(10)
            s.commit()

    t = threading.Thread(target=writer)
    t.start()
    try:
        assert held.wait(10)
        t0 = time.monotonic()
        with Session(db.reader(engine)) as s:  # a snapshot from before the writer's commit
            states = [r.state for r in s.exec(select(InstanceRow))]
        assert states == ["pending"] and time.monotonic() - t0 < 2
    finally:
        done.set()
        t.join(10)
    with Session(db.reader(engine)) as s:
        assert [r.state for r in s.exec(select(InstanceRow))] == ["running"]
