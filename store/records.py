"""Writes of the store's projection: workers from agent reports, deployments, instance states."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, insert, update
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from contracts.control import HostReport, InstanceRecord
from store import changes
from store.engine_keys import check_launches, engine_keys, host_keys, needs_proof
from store.wanted import unwanted
from store.tables import DeploymentRow, InstanceRow, ModelFileRow, WorkerRow, utcnow


def upsert_worker(engine: Engine, report: HostReport, state: str = "ready") -> bool:
    """Record a host's inventory; True when anything the scheduler reads changed."""
    return see_worker(engine, report, state)[0]


def see_worker(engine: Engine, report: HostReport, state: str = "ready") -> tuple[bool, bool]:
    """Record a host's inventory: (anything the scheduler reads changed, the agent restarted: the
    report comes from another agent run than the last one recorded)."""
    fp = report.fingerprint()
    with Session(engine) as s:
        row = s.get(WorkerRow, report.name)
        changed = row is None or row.fingerprint != fp or row.state != state
        restarted = row is not None and bool(row.boot) and bool(report.boot) and row.boot != report.boot
        row = row or WorkerRow(name=report.name)
        row.state, row.state_reason, row.cluster, row.labels = state, "", report.cluster, report.labels
        row.ram_total, row.unified_memory = report.ram_total, report.unified_memory
        row.reserved_ram, row.reserved_vram = report.reserved_ram, report.reserved_vram
        row.backends, row.simulated, row.fingerprint = report.backends, report.simulated, fp
        row.runs, row.commands, row.kv_connectors = report.runs, report.commands, report.kv_connectors
        row.gpus = [g.model_dump(mode="json") for g in report.gpus]
        row.updated_at = utcnow()
        row.boot = report.boot or row.boot
        if changed:
            row.generation += 1
        s.add(row)
        s.commit()
        return changed, restarted


def forget_worker(engine: Engine, name: str) -> str | None:
    """Remove a host that is gone for good (``gpuflow hosts forget``): its worker row and its
    model-file sightings. Refused, with the reason returned and nothing written, while it is READY
    or holds any ledger line: its replicas first move away (after their unreachable grace). The
    worker row is locked first (PostgreSQL; SQLite's write lock covers the whole transaction), so a
    booking made at the same moment either came first and is seen here, or comes after and finds
    no worker (ledger.check refuses it)."""
    from store.tables import ReservationRow

    with Session(engine) as s:
        stmt = select(WorkerRow).where(WorkerRow.name == name)
        if s.get_bind().dialect.name != "sqlite":
            stmt = stmt.with_for_update()
        row = s.exec(stmt).first()
        if row is None:  # never recorded (or forgotten before): nothing to remove
            return None
        if row.state == "ready":
            return f"host {name} is READY; stop its agent first (a host that answers keeps running its servers)"
        held = sorted(set(s.exec(select(ReservationRow.instance).where(ReservationRow.worker == name))))
        if held:
            return (f"host {name} still holds the reservations of {len(held)} replica(s) ({', '.join(held[:5])}"
                    f"{', ...' if len(held) > 5 else ''}); they are placed elsewhere after their unreachable grace "
                    "(GPUFLOW_TIMINGS__UNREACHABLE_GRACE_S of their deployment), then it can be forgotten")
        files = s.exec(select(ModelFileRow).where(ModelFileRow.worker == name)).all()
        for f in files:
            s.delete(f)
        s.delete(row)
        if files:
            changes.bump(s, "", files=True)  # the snapshot caches read model files again
        s.commit()
        return None


def set_worker_state(engine: Engine, name: str, state: str, reason: str = "") -> bool:
    with Session(engine) as s:
        row = s.get(WorkerRow, name)
        if row is None or (row.state == state and row.state_reason == reason):
            return False
        row.state, row.state_reason, row.updated_at = state, reason, utcnow()
        row.generation += 1
        s.add(row)
        s.commit()
        return True


def cordon_worker(engine: Engine, name: str, on: bool, reason: str = "") -> bool | None:
    """Record host ``name`` cordoned (``on``: no new placements) or not, with the operator's reason.
    True when anything changed (the generation is bumped, so the snapshot caches read the row again
    and ledger.check sees it), False when it was so already, None when the store has no such worker
    yet (the host workflow records its cordon again after the host's hello)."""
    with Session(engine) as s:
        row = s.get(WorkerRow, name)
        if row is None:
            return None
        reason = reason if on else ""
        if bool(row.cordoned) == on and (row.cordon_reason or "") == reason:
            return False
        row.cordoned, row.cordon_reason, row.updated_at = on, reason, utcnow()
        row.generation += 1
        s.add(row)
        s.commit()
        return True


QUEUED = ("pending", "analyzing")  # in the PENDING queue: ``queued_at`` (arrival) is kept from the first
# of these states until the instance is placed (or fails, or goes); a later return starts a new arrival


def record_instance(engine: Engine, rec: InstanceRecord, check_launch: bool = True) -> None:
    """Set the instance's row to ``rec`` (inserted if missing)."""
    record_instances(engine, [rec], check_launch)


def record_instances(engine: Engine, recs: list[InstanceRecord], check_launch: bool = True) -> None:
    """Set each instance's row to its record, in order, in one transaction (one commit for a batch:
    activities/record_batch.py). Core statements: the instance workflows write one at every state
    change, and on SQLite the writers take turns (db.py). A RUNNING record with a port or an address
    is written only when its host proved the launch and the ledger books it there
    (engine_keys.check_launches: UnprovenLaunch, and nothing of the batch is written);
    ``check_launch`` False only for rows no agent launched (a test's or a benchmark's fixtures)."""
    now = utcnow()
    t = InstanceRow.__table__
    hosts = host_keys(engine, [r.worker for r in recs if r.worker and (r.key_id or needs_proof(r))])
    keys = engine_keys(engine, recs, hosts)  # each launched engine's key, from its nonce (store/engine_keys.py)
    with Session(engine) as s:
        if check_launch:
            check_launches(s, recs, hosts)
        conn = s.connection()
        bumped: list[tuple[str, bool]] = []
        for rec in recs:
            vals: dict[str, Any] = dict(
                deployment=rec.deployment, model=rec.model, state=rec.state, reason=rec.reason, worker=rec.worker,
                gpu_indexes=list(rec.gpu_indexes), restarts=rec.restarts, pid=rec.pid, port=rec.port,
                address=rec.address, kv_events_port=rec.kv_events_port, bootstrap_port=rec.bootstrap_port,
                engine_key=keys.get(rec.name), updated_at=now)
            if rec.decision is not None:
                vals["decision"] = rec.decision
            queued = rec.state in QUEUED
            if rec.state == "deleted":
                vals["wanted"] = False  # for good: its deployment starts a new one to replace it
            if not conn.execute(update(t).where(t.c.name == rec.name).values(
                    **vals, queued_at=func.coalesce(t.c.queued_at, now) if queued else None)).rowcount:
                # a workflow its deployment did not start (start_instances writes the first row): shown, never booked
                conn.execute(insert(t).values(**{**vals, "wanted": False}, name=rec.name,
                                              queued_at=now if queued else None))
            file_state = "ready" if rec.state == "running" else rec.model_file_state
            if file_state and rec.worker and rec.model_source and not rec.model_source.startswith("/"):
                # a server that came up there had its hub files there: the locality scorer prefers this
                # host next time (a download under way or broken is recorded too). Local paths are not
                # recorded: the local-path filter would read one sighting as "only there", while shared
                # storage may hold them everywhere.
                f = s.get(ModelFileRow, (rec.worker, rec.model_source)) or ModelFileRow(worker=rec.worker,
                                                                                        source=rec.model_source)
                f.state, f.updated_at = file_state, utcnow()
                s.add(f)
                s.flush()
            bumped.append((rec.name, bool(file_state and rec.worker)))
        changes.bump_many(s, bumped)
        s.commit()


def set_pending_reasons(engine: Engine, reasons: dict[str, tuple[str, str]]) -> int:
    """instance -> (the reason read, the current one): each row still PENDING and still holding the
    reason read gets the current one (compare-and-set, so a workflow's own newer record wins);
    returns how many changed. The PENDING queue's wake keeps waiting replicas' reasons current
    (activities/wake_queue.py); no placement reads a reason, so the snapshot's change log is not bumped."""
    t = InstanceRow.__table__
    n = 0
    with Session(engine) as s:
        conn = s.connection()
        for name, (old, new) in sorted(reasons.items()):
            n += conn.execute(update(t).where(t.c.name == name, t.c.state == "pending", t.c.reason == old)
                              .values(reason=new)).rowcount
        s.commit()
    return n


def create_instance(engine: Engine, rec: InstanceRecord) -> bool:
    """Insert the instance's first row; never overwrites one its workflow has written since
    (a retried start must not turn a RUNNING instance back into PENDING)."""
    return bool(create_instances(engine, [rec]))


def create_instances(engine: Engine, recs: list[InstanceRecord]) -> list[str]:
    """Insert the first row of each instance in one transaction (one commit for a batch of
    replicas, not one each), wanted: its deployment asked for it, so the ledger may book it. A row
    written since is left as it is: its own workflow's (a retried start), or one that somebody's
    workflow of that name wrote before the deployment started it, which stays unwanted (the
    deployment's start adopts a running workflow of that id: this one is never booked, and the
    deployment replaces it once it ends). A deleted one (a deployment made again after a delete
    reuses the names) is a new instance's first row. Returns the names inserted."""
    if not recs:
        return []
    with Session(engine) as s:
        have = {r.name: r for r in s.exec(select(InstanceRow).where(InstanceRow.name.in_([r.name for r in recs])))}
        made = []
        for rec in recs:
            row = have.get(rec.name)
            if row is not None and row.state != "deleted":
                continue
            row = row or InstanceRow(name=rec.name, deployment=rec.deployment)
            row.deployment, row.model, row.state, row.reason, row.wanted = rec.deployment, rec.model, rec.state, "", True
            row.queued_at, row.updated_at = (utcnow() if rec.state in QUEUED else None), utcnow()
            have[rec.name] = row
            s.add(row)
            made.append(rec.name)
        changes.bump_many(s, [(name, False) for name in made])
        s.commit()
        return made


ON_A_HOST = ("scheduled", "starting", "running", "error", "unreachable", "draining", "stopping")


def mark_gone(engine: Engine, name: str, why: str) -> str | None:
    """An instance whose workflow ended without its own teardown (terminated, timed out, never
    started): record it deleted. Returns the worker that may still run its process."""
    with Session(engine) as s:
        row = s.get(InstanceRow, name)
        if row is None or row.state == "deleted":
            return None
        worker = row.worker if row.state in ON_A_HOST else None
        row.state, row.reason, row.updated_at, row.wanted = "deleted", why, utcnow(), False
        s.add(row)
        changes.bump(s, name)
        s.commit()
        return worker


def unwanted_problem(engine: Engine, instance: str) -> str | None:
    """Why ``instance`` is not a replica its deployment wants (store/wanted.py ``unwanted``; None: it is)."""
    t = InstanceRow.__table__
    with Session(engine) as s:
        row = s.connection().execute(select(t.c.deployment, t.c.state, t.c.wanted).where(t.c.name == instance)).first()
    return unwanted(instance, row)


def save_deployment(engine: Engine, name: str, spec: dict[str, Any], replicas: int, state: str = "active") -> None:
    with Session(engine) as s:
        row = s.get(DeploymentRow, name) or DeploymentRow(name=name)
        row.spec, row.replicas, row.state, row.updated_at = spec, replicas, state, utcnow()
        s.add(row)
        s.commit()


def pending_instances(engine: Engine) -> list[str]:
    with Session(engine) as s:
        return list(s.exec(select(InstanceRow.name).where(InstanceRow.state == "pending").order_by(InstanceRow.updated_at)))


def instances_of(engine: Engine, deployment: str | None = None) -> list[InstanceRow]:
    with Session(engine) as s:
        stmt = select(InstanceRow).order_by(InstanceRow.name)
        if deployment:
            stmt = stmt.where(InstanceRow.deployment == deployment)
        return list(s.exec(stmt))


def workers(engine: Engine) -> list[WorkerRow]:
    with Session(engine) as s:
        return list(s.exec(select(WorkerRow).order_by(WorkerRow.name)))


def preempted_running(engine: Engine, names: list[str]) -> list[str]:
    """Of these preempted instances, those whose process may still run: in a state on a host with
    no placement (ledger.preempt took it; the instance records PENDING once its process stopped,
    and a placement again once it is re-booked)."""
    with Session(engine) as s:
        rows = s.exec(select(InstanceRow).where(InstanceRow.name.in_(names))).all()
        return sorted(r.name for r in rows if r.state in ON_A_HOST and r.placement is None)
