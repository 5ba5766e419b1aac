"""The tenants file in the store (one row, scheduler/tenancy/config.py), who owns each deployment,
and what each tenant holds in the ledger.

``apply`` replaces the file whole, in one transaction, or changes nothing: a file that drops a
tenant some live deployment still names is refused, naming them. Readers that poll (the gateway,
the decide activity) compare ``version`` and re-parse only when it moved."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlmodel import Session, func, select

from store.snapshot import session
from store.tables import DeploymentRow, InstanceRow, ReservationRow, TenantsRow, utcnow
from scheduler.errors import InvalidInput
from scheduler.tenancy.admission import borrowing, over_limit, within_guarantee
from scheduler.tenancy.config import DEFAULT, TenantsFile
from scheduler.tenancy.usage import Usage


@dataclass(frozen=True)
class Applied:
    file: TenantsFile
    version: int


def load(engine: Engine) -> TenantsFile:
    """The applied file; an empty one (every deployment in ``default``, unbounded) before any apply."""
    return read(engine).file


def read(engine: Engine) -> Applied:
    with Session(engine) as s:
        row = s.get(TenantsRow, 1)
        if row is None:
            return Applied(TenantsFile(), 0)
        return Applied(TenantsFile.model_validate(row.doc), row.version)


def version(engine: Engine) -> int:
    with Session(engine) as s:
        v = s.exec(select(TenantsRow.version).where(TenantsRow.id == 1)).first()
        return v or 0


def tenant_of(spec: dict) -> str:
    return str(spec.get("tenant") or "default")


def live_deployments(s: Session) -> list[DeploymentRow]:
    return list(s.exec(select(DeploymentRow).where(DeploymentRow.state != "deleted").order_by(DeploymentRow.name)))


def apply(engine: Engine, tf: TenantsFile) -> int:
    """Store ``tf`` as the tenants file; returns its version. Refused (nothing written) when a
    live deployment names a tenant ``tf`` does not define."""
    with Session(engine) as s:
        orphans: dict[str, list[str]] = {}
        for d in live_deployments(s):
            t = tenant_of(d.spec)
            if tf.get(t) is None:
                orphans.setdefault(t, []).append(d.name)
        if orphans:
            raise InvalidInput("the tenants file drops tenants that deployments still use: " + "; ".join(
                f"{t} ({', '.join(ds[:5])}{' ...' if len(ds) > 5 else ''})" for t, ds in sorted(orphans.items()))
                + "; delete those deployments or move them to another tenant first")
        row = s.get(TenantsRow, 1) or TenantsRow(id=1, version=0)
        row.doc, row.version, row.updated_at = tf.model_dump(mode="json", exclude_none=True), row.version + 1, utcnow()
        s.add(row)
        s.commit()
        return row.version


def problem(engine: Engine, tenant: str | None) -> str | None:
    """Why a spec naming ``tenant`` is refused (a typo is caught), else None."""
    tf = load(engine)
    if tf.get(tenant) is None:
        names = ["default"] + [t.name for t in tf.tenants if t.name != "default"]
        known = ", ".join(names[:20]) + (f", and {len(names) - 20:,} more" if len(names) > 20 else "")
        return f"tenant {tenant!r} is not in the tenants file (known: {known}); apply one that names it first"
    return None


@dataclass(frozen=True)
class Owner:
    tenant: str
    priority: int


def owners(engine: Engine) -> dict[str, Owner]:
    """Deployment -> (tenant, deployment priority), for every live deployment."""
    with Session(engine) as s:
        return {d.name: Owner(tenant_of(d.spec), int(d.spec.get("priority") or 0)) for d in live_deployments(s)}


def usage(engine: Engine) -> dict[str, Usage]:
    """Tenant -> what its replicas hold in the ledger (each GPU line counts 1 GPU)."""
    out: dict[str, Usage] = {}
    with Session(engine) as s:
        tenant_of_dep = {d.name: tenant_of(d.spec) for d in s.exec(select(DeploymentRow))}
        dep_of = dict(s.exec(select(InstanceRow.name, InstanceRow.deployment)).all())
        for r in s.exec(select(ReservationRow)):
            t = tenant_of_dep.get(dep_of.get(r.instance, ""), "default")
            out[t] = out.get(t, Usage()) + Usage(gpus=1 if r.gpu_index >= 0 else 0, vram=r.vram, ram=r.ram)
    return out


def pending_by_tenant(engine: Engine) -> dict[str, int]:
    with Session(engine) as s:
        tenant_of_dep = {d.name: tenant_of(d.spec) for d in live_deployments(s)}
        out: dict[str, int] = {}
        for dep in s.exec(select(InstanceRow.deployment).where(InstanceRow.state == "pending")):
            t = tenant_of_dep.get(dep, "default")
            out[t] = out.get(t, 0) + 1
        return out


# --- under the ledger's locks (store/ledger.py) ------------------------------------------

def tenant_in(s: Session, instance: str) -> tuple[str, TenantsFile]:
    """The tenant of ``instance``'s deployment as the store has it now, and the tenants file."""
    conn = s.connection()  # Core reads: this runs under the write lock of every booking
    doc = conn.execute(select(TenantsRow.__table__.c.doc).where(TenantsRow.__table__.c.id == 1)).scalar()
    tf = TenantsFile.model_validate(doc) if doc is not None else TenantsFile()
    i, d = InstanceRow.__table__, DeploymentRow.__table__
    spec = conn.execute(select(d.c.spec).select_from(i.join(d, i.c.deployment == d.c.name))
                        .where(i.c.name == instance)).scalar()
    return (tenant_of(spec) if spec is not None else "default"), tf


def lock_tenant(s: Session, tenant: str) -> None:
    """Serialize the bookings of one tenant until the transaction ends. PostgreSQL: a transaction
    advisory lock keyed by the tenant's name (bookings of other tenants go on in parallel).
    SQLite: nothing to do, the transaction holds the database's write lock (BEGIN IMMEDIATE)."""
    if s.get_bind().dialect.name == "postgresql":
        key = zlib.crc32(f"gpuflow-tenant:{tenant}".encode()) - 2**31  # a signed 32-bit key
        s.connection().execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})


def usage_in(s: Session, tenant: str, exclude: set[str]) -> Usage:
    """What ``tenant``'s replicas hold in the ledger, read in this transaction, leaving out ``exclude``."""
    deps = [d.name for d in s.exec(select(DeploymentRow)) if tenant_of(d.spec) == tenant]
    if not deps:
        return Usage()
    insts = select(InstanceRow.name).where(InstanceRow.deployment.in_(deps))
    out = Usage()
    for r in s.exec(select(ReservationRow).where(ReservationRow.instance.in_(insts))):
        if r.instance not in exclude:
            out = out + Usage(gpus=1 if r.gpu_index >= 0 else 0, vram=r.vram, ram=r.ram)
    return out


def over_limit_in(s: Session, instance: str, rows: list[ReservationRow], exclude: set[str]) -> str | None:
    """The quota reason if booking ``rows`` for ``instance`` takes its tenant over a limit, checked
    against the ledger under a lock held to the end of the transaction; else None."""
    tenant, tf = tenant_in(s, instance)
    t = tf.get(tenant) or DEFAULT
    if not t.limit.named():
        return None
    lock_tenant(s, tenant)
    need = Usage(gpus=sum(1 for r in rows if r.gpu_index >= 0), vram=sum(r.vram for r in rows),
                 ram=sum(r.ram for r in rows))
    return over_limit(t, usage_in(s, tenant, exclude | {instance}), need)


def view(bind: Engine | Session) -> tuple[TenantsFile, dict[str, Owner]]:
    """The tenants file and who owns each live deployment, read in one session (``bind`` may be the
    ledger's transaction: a re-decision under its locks reads there)."""
    with session(bind) as s:
        row = s.get(TenantsRow, 1)
        tf = TenantsFile.model_validate(row.doc) if row is not None else TenantsFile()
        d = DeploymentRow.__table__  # two fields of each spec, read in SQL: every decision reads this
        rows = s.connection().execute(select(d.c.name, d.c.spec["tenant"].as_string(), d.c.spec["priority"].as_integer())
                                      .where(d.c.state != "deleted"))
        return tf, {name: Owner(str(tenant or "default"), int(priority or 0)) for name, tenant, priority in rows}


def _use(rows: list[ReservationRow]) -> Usage:
    return Usage(gpus=sum(1 for r in rows if r.gpu_index >= 0), vram=sum(r.vram for r in rows), ram=sum(r.ram for r in rows))


def reclaim_problem_in(s: Session, instance: str, rows: list[ReservationRow],
                       victims: dict[str, list[ReservationRow]]) -> str | None:
    """A preemption across tenants, checked again under the locks of every tenant in it (sorted,
    so two cannot deadlock): the preemptor's tenant stays within its guarantee with ``rows``, and
    each victim tenant still borrows before its last victim is taken (preemption.py's rules; two
    control-plane workers preempting at once could otherwise both take the last of them)."""
    mine, tf = tenant_in(s, instance)
    theirs = {v: tenant_in(s, v)[0] for v in victims}
    cross = sorted({t for t in theirs.values() if t != mine})
    if not cross:
        return None  # within one tenant, by deployment priority: nothing is reclaimed
    for t in sorted({mine, *cross}):
        lock_tenant(s, t)
    if not within_guarantee(tf.get(mine) or DEFAULT, usage_in(s, mine, set(victims) | {instance}), _use(rows)):
        return f"tenant {mine} would pass its guarantee by this preemption"
    for t in cross:
        taken = [_use(victims[v]) for v, tv in theirs.items() if tv == t]
        before_last = usage_in(s, t, set()) - sum(taken, Usage()) + min(taken, key=lambda u: (u.gpus, u.vram, u.ram))
        if not borrowing(tf.get(t) or DEFAULT, before_last):
            return f"tenant {t} no longer borrows what this preemption would take"
    return None


def booked_since(bind: Engine | Session) -> dict[str, float]:
    """Instance -> when it was booked (its first ledger line), as a timestamp: "most recently started"
    in the preemption order."""
    with session(bind) as s:
        rows = s.exec(select(ReservationRow.instance, func.min(ReservationRow.created_at))
                      .group_by(ReservationRow.instance)).all()
    return {n: t.timestamp() if t is not None else 0.0 for n, t in rows}
