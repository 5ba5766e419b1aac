"""Requests and tokens per API key, tenant and model, by minute (``gpuflow_key_usage``): what the
console's API-keys page and ``gpuflow keys usage`` show (GPUStack's users ask for usage per key).

Each gateway counts in memory, in minute buckets (gateway/usage_counter.py), and adds its buckets
here every few seconds in one statement: an upsert that adds to the stored counts, so a bucket
flushed twice in the same minute sums, and each gateway has its own rows (no two write the same
row). Rows older than ``KEEP_DAYS`` are pruned by the gateways. A minute is an integer, minutes
since the Unix epoch (UTC): no time zone to get wrong between SQLite and PostgreSQL.

``key_id`` is the key's public id, or ``""`` for an open gateway's requests (no key exists).
``estimated_tokens``: of the prompt and completion tokens, those the gateway estimated (a stream
whose engine sent no usage, with no tokenizer at hand: gateway/stream_tokens.py); a store made
before it has the column added, 0 in its old rows."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import BigInteger, case, delete, func, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine
from sqlmodel import Field, Session, SQLModel, select

KEEP_DAYS = 8  # a day's totals stay readable a week later
COLUMN_MAX = 2**63 - 1  # BIGINT's largest, on SQLite and PostgreSQL: a stored count saturates there
MAX_ANSWER_TOKENS = 2**32  # one answer's tokens, at most (the largest contexts are about 2**24)


class KeyUsageRow(SQLModel, table=True):
    __tablename__ = "gpuflow_key_usage"
    minute: int = Field(primary_key=True, sa_type=BigInteger)  # minutes since the epoch, UTC
    gateway: str = Field(primary_key=True)
    key_id: str = Field(primary_key=True)  # "" on an open gateway
    tenant: str = Field(primary_key=True)
    model: str = Field(primary_key=True)
    requests: int = Field(default=0, sa_type=BigInteger)
    prompt_tokens: int = Field(default=0, sa_type=BigInteger)
    completion_tokens: int = Field(default=0, sa_type=BigInteger)
    estimated_tokens: int = Field(default=0, sa_type=BigInteger, sa_column_kwargs={"server_default": text("0")})


@dataclass(frozen=True)
class Counts:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated_tokens: int = 0  # of the two above, those the gateway estimated

    def __add__(self, o: "Counts") -> "Counts":
        return Counts(self.requests + o.requests, self.prompt_tokens + o.prompt_tokens,
                      self.completion_tokens + o.completion_tokens, self.estimated_tokens + o.estimated_tokens)


Bucket = tuple[int, str, str, str]  # (minute, key_id, tenant, model)


@dataclass(frozen=True)
class Totals:
    """Sums over a window: per key id (with its tenant), and per tenant."""

    by_key: dict[str, Counts] = field(default_factory=dict)
    key_tenant: dict[str, str] = field(default_factory=dict)
    by_tenant: dict[str, Counts] = field(default_factory=dict)


def minute_of(t: datetime | float) -> int:
    """The minute ``t`` falls in: a timezone-aware datetime, or seconds since the epoch."""
    return int((t.timestamp() if isinstance(t, datetime) else t) // 60)


def _insert(engine: Engine):
    return (postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert)(KeyUsageRow)


COUNTS = ("requests", "prompt_tokens", "completion_tokens", "estimated_tokens")


def clip(n) -> int:
    """A count as a column holds it: a whole number in [0, COLUMN_MAX] (anything else is 0)."""
    return min(n, COLUMN_MAX) if type(n) is int and n > 0 else 0


def add(engine: Engine, gateway: str, buckets: dict[Bucket, Counts]) -> int:
    """Add ``gateway``'s ``buckets`` to the stored counts, in one statement; how many rows. Each
    count is clipped to its column, and a sum saturates at COLUMN_MAX instead of overflowing it
    (SQLite would turn it into a float, PostgreSQL refuse the statement): no bucket can fail the
    others."""
    if not buckets:
        return 0
    rows = [dict(minute=m, gateway=gateway, key_id=k, tenant=t, model=mo,
                 **{n: clip(getattr(c, n)) for n in COUNTS}) for (m, k, t, mo), c in buckets.items()]
    stmt = _insert(engine)
    cols, new = KeyUsageRow.__table__.columns, stmt.excluded
    sums = {n: case((cols[n] > COLUMN_MAX - new[n], COLUMN_MAX), else_=cols[n] + new[n]) for n in COUNTS}
    with engine.begin() as c:
        c.execute(stmt.on_conflict_do_update(index_elements=["minute", "gateway", "key_id", "tenant", "model"],
                                             set_=sums), rows)
    return len(rows)


def prune(engine: Engine, now: datetime | float, keep_days: int = KEEP_DAYS) -> int:
    """Drop the minutes older than ``keep_days``; how many rows went."""
    with engine.begin() as c:
        return c.execute(delete(KeyUsageRow).where(KeyUsageRow.minute < minute_of(now) - keep_days * 1440)).rowcount


def totals(engine: Engine, since: datetime | float, now: datetime | float) -> Totals:
    """The sums over the minutes that start within [since, now]: ``since`` = now - 1 h gives the
    last 60 minutes, the current one included (its count so far)."""
    first, last = math.ceil((since.timestamp() if isinstance(since, datetime) else since) / 60), minute_of(now)
    u = KeyUsageRow
    # SQLite's sum() of integers raises on overflow (rows saturated at COLUMN_MAX add past it); its
    # total() is a float, exact below 2**53; PostgreSQL's sum of a bigint is a numeric, never overflows
    add_up = func.total if engine.dialect.name == "sqlite" else func.sum
    sums = tuple(add_up(getattr(u, n)) for n in COUNTS)
    window = (u.minute >= first, u.minute <= last)
    with Session(engine) as s:
        keyed = s.exec(select(u.key_id, u.tenant, *sums).where(*window).group_by(u.key_id, u.tenant)).all()
        tenants = s.exec(select(u.tenant, *sums).where(*window).group_by(u.tenant)).all()
    out = Totals()
    for kid, tenant, *n in keyed:
        out.by_key[kid] = _counts(out.by_key.get(kid, Counts()) + _counts(Counts(*(int(v or 0) for v in n))))
        out.key_tenant[kid] = tenant
    for tenant, *n in tenants:
        out.by_tenant[tenant] = _counts(Counts(*(int(v or 0) for v in n)))
    return out


def _counts(c: Counts) -> Counts:
    """``c`` with each count at most COLUMN_MAX (what a saturated row reads as, however many add up)."""
    return Counts(*(min(getattr(c, n), COLUMN_MAX) for n in COUNTS))
