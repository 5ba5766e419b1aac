"""A monotonic change number for instances and their reservations, so a snapshot cache can read
only what changed since it last looked (store/snapshot_cache.py).

Every write of an instance row or of its ledger lines calls ``bump`` in the same transaction: it
increments the one counter row and logs (seq, instance). The counter row is updated in place,
so on PostgreSQL concurrent writers queue on its row lock and commit in seq order; on SQLite
every transaction holds the database lock. A reader that sees seq S therefore sees every log
line up to S. The log keeps the last KEEP changes; a cache further behind reloads everything.
Workers need no log: each carries its own ``generation``.
"""

from __future__ import annotations

from sqlalchemy import delete, insert, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, SQLModel, select

KEEP = 20_000  # log lines kept; pruned every PRUNE_EVERY changes
PRUNE_EVERY = 1_000


class ChangeCounterRow(SQLModel, table=True):
    __tablename__ = "gpuflow_change_counter"
    id: int = Field(default=1, primary_key=True)
    seq: int = 0


class ChangeRow(SQLModel, table=True):
    __tablename__ = "gpuflow_changes"
    seq: int = Field(primary_key=True)
    instance: str = ""
    files: bool = False  # the write touched model_files too


_COUNTER, _LOG = ChangeCounterRow.__table__, ChangeRow.__table__


def ensure_counter(engine: Engine) -> None:
    with Session(engine) as s:
        if s.get(ChangeCounterRow, 1) is None:
            s.add(ChangeCounterRow(id=1, seq=0))
            try:
                s.commit()
            except IntegrityError:  # another process made it first
                s.rollback()


def bump(s: Session, instance: str, files: bool = False) -> int:
    """Record that ``instance`` (its row, its ledger lines, or with ``files`` its model files)
    changed in the transaction of ``s``; returns the new change number. Core statements, not the
    ORM: this runs in every write transaction, and on SQLite the writers take turns (db.py)."""
    return bump_many(s, [(instance, files)])


def bump_many(s: Session, changed: list[tuple[str, bool]]) -> int:
    """``bump`` for several changes in one transaction: (instance, files) each, numbered in order;
    two statements for all of them (the counter moved once, the log lines inserted together), where
    a ``bump`` each cost two a change (a batch of 50 new rows: 100). The log is pruned when a
    multiple of PRUNE_EVERY is among the numbers. Returns the last number (the counter's,
    unchanged, for none)."""
    if not changed:
        return current(s)
    conn = s.connection()
    n = len(changed)
    last = conn.execute(update(_COUNTER).where(_COUNTER.c.id == 1).values(seq=_COUNTER.c.seq + n)
                        .returning(_COUNTER.c.seq)).scalar()
    if last is None:  # a store made before the counter existed
        conn.execute(insert(_COUNTER).values(id=1, seq=n))
        last = n
    first = last - n + 1
    conn.execute(insert(_LOG), [dict(seq=first + i, instance=name, files=files)
                                for i, (name, files) in enumerate(changed)])
    if last // PRUNE_EVERY > (first - 1) // PRUNE_EVERY:  # a multiple of PRUNE_EVERY among first..last
        conn.execute(delete(_LOG).where(_LOG.c.seq <= last - KEEP))
    return last


def current(s: Session) -> int:
    return s.exec(select(ChangeCounterRow.seq).where(ChangeCounterRow.id == 1)).first() or 0


def since(s: Session, seq: int) -> tuple[set[str], bool, bool]:
    """(instances changed after ``seq``, model files changed?, complete?). Not complete: the log
    no longer reaches back to ``seq``; the caller reloads everything."""
    rows = list(s.exec(select(ChangeRow.seq, ChangeRow.instance, ChangeRow.files).where(ChangeRow.seq > seq)))
    if not rows:
        return set(), False, False
    complete = min(r[0] for r in rows) == seq + 1
    return {r[1] for r in rows}, any(r[2] for r in rows), complete
