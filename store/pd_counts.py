"""Each gateway's prefill/decode counts per deployment (``gpuflow_pd_counts``): requests
disaggregated, skipped, served by a decode alone as a fallback, and KV transfer failures, the
gateway's own view of whether a group really disaggregates (scheduler/groups/pd_health.py judges
it: ``pd_ineffective``).

A gateway counts in memory, cumulatively since it started, and reports its counts every refresh
(``report``): one row per gateway, deployment and ``SLOT_S`` slot, overwritten within its slot,
so the store keeps a sample every ``SLOT_S`` per gateway (``KEEP_S`` of them; older ones are
pruned by the reports). ``totals`` sums the newest sample of every live gateway (reported within
``live_s``); ``samples`` gives the series the judgement reads over its window. Times are seconds
since the Unix epoch, UTC (a float column): no time zone to get wrong between SQLite and
PostgreSQL. Each engine-side witness (a decode's own metrics) is stored the same way, its source
named ``engine:<instance>``."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import BigInteger, Float, delete
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine
from sqlmodel import Field, Session, SQLModel, select

from scheduler.groups.pd_health import ENGINE, PDCounts, Sample
from store import serving

__all__ = ["PDCounts", "Sample", "report", "totals", "samples", "samples_in", "LIVE_S", "SLOT_S", "KEEP_S"]

LIVE_S = serving.LIVE_S  # a gateway silent this long no longer counts in ``totals`` (as for its in-flight counts)
SLOT_S = 5  # one sample per gateway and deployment kept every 5 s: 6 in a 30 s judgement window
KEEP_S = 600.0  # samples kept 10 minutes: 120 rows per gateway and group at most (one per slot)
COLUMN_MAX = 2**63 - 1  # BIGINT's largest: a count saturates there
COUNTS = ("disaggregated", "skipped", "fallback", "transfer_failures")


class PDCountsRow(SQLModel, table=True):
    __tablename__ = "gpuflow_pd_counts"
    source: str = Field(primary_key=True)  # the gateway's id (store/serving.py GatewayRow.id), or engine:<instance>
    deployment: str = Field(primary_key=True)
    slot: int = Field(primary_key=True, sa_type=BigInteger)  # at_s // SLOT_S
    at_s: float = Field(sa_type=Float, index=True)  # when this sample was taken, seconds since the epoch
    disaggregated: int = Field(default=0, sa_type=BigInteger)
    skipped: int = Field(default=0, sa_type=BigInteger)
    fallback: int = Field(default=0, sa_type=BigInteger)
    transfer_failures: int = Field(default=0, sa_type=BigInteger)


def seconds(now: datetime | float | None) -> float:
    """``now`` (a timezone-aware datetime, seconds since the epoch, or None: the clock's now) in seconds."""
    if now is None:
        return datetime.now(timezone.utc).timestamp()
    return now.timestamp() if isinstance(now, datetime) else float(now)


def clip(n) -> int:
    """A count as the column holds it: a whole number in [0, COLUMN_MAX] (anything else is 0)."""
    return min(n, COLUMN_MAX) if type(n) is int and n > 0 else 0


def report(engine: Engine, gateway: str, counts: dict[str, PDCounts], now: datetime | float | None = None) -> int:
    """Store ``gateway``'s cumulative ``counts`` per deployment as of ``now``, in one statement
    (this slot's sample replaced), and prune the samples older than KEEP_S; how many rows written."""
    at = seconds(now)
    rows = [dict(source=gateway, deployment=dep, slot=int(at // SLOT_S), at_s=at,
                 **{n: clip(getattr(c, n)) for n in COUNTS}) for dep, c in counts.items()]
    with engine.begin() as c:
        if rows:
            stmt = (postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert)(PDCountsRow)
            c.execute(stmt.on_conflict_do_update(index_elements=["source", "deployment", "slot"],
                                                 set_={n: stmt.excluded[n] for n in ("at_s", *COUNTS)}), rows)
        c.execute(delete(PDCountsRow).where(PDCountsRow.at_s < at - KEEP_S))
    return len(rows)


def _counts(r: PDCountsRow) -> PDCounts:
    return PDCounts(**{n: getattr(r, n) for n in COUNTS})


def samples(engine: Engine, since_s: float, now: datetime | float | None = None) -> list[Sample]:
    """Every sample taken in [since_s, now], oldest first: the series the judgement reads."""
    with Session(engine) as s:
        return samples_in(s, since_s, seconds(now))


def samples_in(s: Session, since_s: float, now_s: float, deployments: list[str] | None = None) -> list[Sample]:
    """``samples`` in an open session, of ``deployments`` only where named."""
    r = PDCountsRow
    q = select(r).where(r.at_s >= since_s, r.at_s <= now_s)
    if deployments is not None:
        q = q.where(r.deployment.in_(deployments))
    return [Sample(x.source, x.deployment, x.at_s, _counts(x)) for x in s.exec(q.order_by(r.at_s))]


def totals(engine: Engine, now: datetime | float | None = None, live_s: float = LIVE_S,
           gateways_only: bool = True) -> dict[str, PDCounts]:
    """Per deployment: the newest counts of every gateway that reported within ``live_s``, summed
    (the engine-side witnesses left out unless ``gateways_only`` is False)."""
    at = seconds(now)
    newest: dict[tuple[str, str], Sample] = {}
    for x in samples(engine, at - live_s, at):
        if not (gateways_only and x.source.startswith(ENGINE)):
            newest[(x.source, x.deployment)] = x  # oldest first: the last one stays
    out: dict[str, PDCounts] = {}
    for (_, dep), x in sorted(newest.items()):
        out[dep] = out.get(dep, PDCounts()) + x.counts
    return out
