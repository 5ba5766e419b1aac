"""Measured memory in the store: each replica's latest figures and peak, per host
(``gpuflow_instance_usage``), and the same per (model source, backend, parameters, GPU model)
(``gpuflow_usage_profiles``): the ground for learning claims from measurements later (GPUStack's
users see estimates miss both ways: 13.8 GiB estimated against 926 MiB used, 954 MiB against
4.2 GiB).

One host's report is written in one transaction of three statements, whatever its size: one
multi-row upsert per table (the peak kept as the larger of the stored and the reported) and one
delete of the host's replicas the report no longer names. A host reports when a figure moved or
every few minutes (worker_agent/usage.py), so 100 hosts cost well under one transaction a second."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Column, JSON, case, delete
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine
from sqlmodel import Field, Session, SQLModel, select

from contracts.usage import ReplicaUse, UsageBatch
from scheduler.claims.fingerprint import text_key
from store.tables import utcnow


class InstanceUsageRow(SQLModel, table=True):
    """One replica's memory on one host (a replica across several hosts has a row on each)."""

    __tablename__ = "gpuflow_instance_usage"
    instance: str = Field(primary_key=True)
    host: str = Field(primary_key=True, index=True)
    gpus: list[dict] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))  # GpuUse per card
    vram_used: int = Field(default=0, sa_type=BigInteger)
    vram_peak: int = Field(default=0, sa_type=BigInteger)
    vram_claimed: int = Field(default=0, sa_type=BigInteger)
    rss: int = Field(default=0, sa_type=BigInteger)
    rss_peak: int = Field(default=0, sa_type=BigInteger)
    ram_claimed: int = Field(default=0, sa_type=BigInteger)
    measured: str = "none"
    profile: str = ""  # its UsageProfileRow's key
    updated_at: datetime = Field(default_factory=utcnow)


class UsageProfileRow(SQLModel, table=True):
    """What replicas of one (source, backend, parameters, GPU model) used, per host they ran on."""

    __tablename__ = "gpuflow_usage_profiles"
    key: str = Field(primary_key=True)  # profile_key(): a hash, so the long parameters need no long index
    source: str = ""
    backend: str = ""
    parameters: str = ""
    gpu_model: str = ""
    gpus: int = 0  # cards the last replica measured held
    vram_latest: int = Field(default=0, sa_type=BigInteger)
    vram_peak: int = Field(default=0, sa_type=BigInteger)
    vram_claimed: int = Field(default=0, sa_type=BigInteger)  # the claim the last one ran under
    rss_latest: int = Field(default=0, sa_type=BigInteger)
    rss_peak: int = Field(default=0, sa_type=BigInteger)
    instance: str = ""  # the last replica measured
    updated_at: datetime = Field(default_factory=utcnow)


def profile_key(r: ReplicaUse) -> str:
    """Per (source, backend, parameters as written, GPU model); the learned claims' fingerprints
    (scheduler/claims/fingerprint.py) hash the same way, over the parameters that change memory."""
    return text_key(r.source, r.backend, r.parameters, r.gpu_model)


def _insert(engine: Engine, table):
    return (postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert)(table)


def _upsert(engine: Engine, table, keys: list[str], peaks: dict[str, str], rows: list[dict]):
    """INSERT ... ON CONFLICT (keys) DO UPDATE: every column from the new row, except each peak
    column (``peaks``: peak -> latest), which keeps the larger of the stored and the new."""
    stmt = _insert(engine, table)
    new = stmt.excluded
    cols = table.__table__.columns
    sets = {c.name: new[c.name] for c in cols if c.name not in keys}
    for peak in peaks:
        sets[peak] = case((new[peak] > cols[peak], new[peak]), else_=cols[peak])
    return stmt.on_conflict_do_update(index_elements=keys, set_=sets), rows


def record(engine: Engine, batch: UsageBatch) -> int:
    """Write one host's report; returns how many replicas it named."""
    now = utcnow()
    measured = [r for r in batch.replicas if r.measured != "none" or r.rss]
    inst = [dict(instance=r.instance, host=batch.host, gpus=[g.model_dump() for g in r.gpus], vram_used=r.vram_used,
                 vram_peak=r.vram_peak, vram_claimed=r.vram_claimed, rss=r.rss, rss_peak=r.rss_peak,
                 ram_claimed=r.ram_claimed, measured=r.measured, profile=profile_key(r), updated_at=now)
            for r in measured]
    profiles: dict[str, dict] = {}
    for r in measured:
        if r.measured == "none" or not r.backend:  # no VRAM figure, or a process without its request
            continue
        p = profiles.get(profile_key(r))
        profiles[profile_key(r)] = dict(
            key=profile_key(r), source=r.source, backend=r.backend, parameters=r.parameters, gpu_model=r.gpu_model,
            gpus=len(r.gpus), vram_latest=r.vram_used, vram_claimed=r.vram_claimed, rss_latest=r.rss,
            vram_peak=max(r.vram_peak, p["vram_peak"] if p else 0), rss_peak=max(r.rss_peak, p["rss_peak"] if p else 0),
            instance=r.instance, updated_at=now)
    with engine.begin() as c:
        gone = delete(InstanceUsageRow).where(InstanceUsageRow.host == batch.host)
        if inst:
            gone = gone.where(InstanceUsageRow.instance.not_in([r["instance"] for r in inst]))
        c.execute(gone)
        if inst:
            c.execute(*_upsert(engine, InstanceUsageRow, ["instance", "host"],
                               {"vram_peak": "vram_used", "rss_peak": "rss"}, inst))
        if profiles:
            c.execute(*_upsert(engine, UsageProfileRow, ["key"], {"vram_peak": "vram_latest", "rss_peak": "rss_latest"},
                               list(profiles.values())))
    return len(inst)


def of_instance(engine: Engine, instance: str) -> list[InstanceUsageRow]:
    """The replica's rows, one per host it runs on."""
    with Session(engine) as s:
        return list(s.exec(select(InstanceUsageRow).where(InstanceUsageRow.instance == instance)))


def profiles(engine: Engine) -> list[UsageProfileRow]:
    with Session(engine) as s:
        return list(s.exec(select(UsageProfileRow).order_by(UsageProfileRow.source, UsageProfileRow.backend)))
