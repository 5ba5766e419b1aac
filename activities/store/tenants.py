"""The tenants file in the store (one row, scheduler/tenancy/config.py), who owns each deployment,
and what each tenant holds in the ledger.

``apply`` replaces the file whole, in one transaction, or changes nothing: a file that drops a
tenant some live deployment still names is refused, naming them. Readers that poll (the gateway,
the decide activity) compare ``version`` and re-parse only when it moved."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from activities.store.tables import DeploymentRow, InstanceRow, ReservationRow, TenantsRow, utcnow
from scheduler.errors import InvalidInput
from scheduler.tenancy.config import TenantsFile
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
        known = ", ".join(["default"] + [t.name for t in tf.tenants if t.name != "default"])
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
