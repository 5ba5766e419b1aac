"""The reservation ledger: no GPU is ever booked beyond what it holds.

``reserve`` runs in one transaction: lock the rows of every worker the plan touches (sorted, so
two transactions cannot deadlock), read the ledger for those workers, and check the plan against
what the workers' current inventory can still give (scheduler.allocatable, the same arithmetic
the policy used). A plan made on a stale snapshot fails with ``StaleDecision``, and the caller
decides again on a fresh one. On SQLite the transaction began with BEGIN IMMEDIATE and holds
the database's write lock throughout.

Every booking, release and inventory change bumps the worker's ``generation`` (the snapshot
cache reads what changed by it). A plan decided on a snapshot that has moved on since is booked
as it is when it still fits: the check, not the generation, is what guards capacity, and a
re-decision under the write lock would hold every other store write behind a whole decision.
Replicas decided one after another in one control-plane process do not pick the same capacity
(the snapshot cache's assumed placements); a plan that no longer fits fails with
``StaleDecision`` and its replica decides again, outside any lock.

Both legs are idempotent and keyed by instance: reserving the same plan twice books once;
releasing twice (or releasing what was never reserved) is a no-op.

Only a wanted instance is booked (store/wanted.py, checked in the booking's transaction): its
deployment exists and is active, started it and has not deleted it, and its name is one of that
deployment's (``<deployment>-<n>``). An instance workflow started by hand, or a workflow of one's
own continued as new into one, holds nothing: ``NotWanted``.
The booking names the backend it was made for, so the ledger's read (store/bookings.py) can say
which processes each host may run for it (contracts/booked_parts.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError
from sqlalchemy import delete, update
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from contracts.control import PlacementPlan
from store import changes, tenants
from store.snapshot import worker_model
from store.tables import DeploymentRow, InstanceRow, ReservationRow, WorkerRow, utcnow
from store.wanted import NotWanted, wanted_problem  # noqa: F401  (ledger.NotWanted: the name its callers catch)
from scheduler.allocatable import Allocated, allocatable
from scheduler.errors import GpuflowError
from scheduler.units import gib


class StaleDecision(GpuflowError):
    """The plan no longer fits: capacity changed since the decision's snapshot."""


class OverQuota(StaleDecision):
    """The booking would take the instance's tenant over a limit (checked on the ledger, under a
    lock per tenant): decided again, the instance then waits PENDING with the quota named."""


def plan_rows(instance: str, plan: PlacementPlan) -> list[ReservationRow]:
    """The ledger lines of a plan: one per GPU (RAM on the first line of each worker)."""
    rows: list[ReservationRow] = []
    parts = [(plan.worker, plan.gpu_indexes, plan.claim, "main")]
    parts += [(s.worker, s.gpu_indexes, s.claim, "subordinate") for s in plan.subordinates]
    for worker, gpus, claim, role in parts:
        indexes = sorted(set(gpus) | set(claim.vram))
        if not indexes:
            rows.append(ReservationRow(instance=instance, worker=worker, gpu_index=-1, ram=claim.ram, role=role))
            continue
        for n, idx in enumerate(indexes):
            rows.append(ReservationRow(instance=instance, worker=worker, gpu_index=idx, vram=claim.vram.get(idx, 0),
                                       ram=claim.ram if n == 0 else 0, role=role))
    return rows


def same_rows(held: list[ReservationRow], wanted: list[ReservationRow]) -> bool:
    key = lambda r: (r.worker, r.gpu_index, r.vram, r.ram)  # noqa: E731
    return sorted(map(key, held)) == sorted(map(key, wanted))


def held_rows(s: Session, instance: str) -> list:
    t = ReservationRow.__table__
    cols = select(t.c.worker, t.c.gpu_index, t.c.vram, t.c.ram)
    return list(s.connection().execute(cols.where(t.c.instance == instance)))


def lock_workers(session: Session, names: list[str]) -> dict[str, WorkerRow]:
    stmt = select(WorkerRow).where(WorkerRow.name.in_(names)).order_by(WorkerRow.name)
    if session.get_bind().dialect.name != "sqlite":
        stmt = stmt.with_for_update()
    return {w.name: w for w in session.exec(stmt)}


def _booked(session: Session, workers: list[str], exclude: str | set[str]) -> dict[str, Allocated]:
    out: dict[str, Allocated] = {}
    gone = {exclude} if isinstance(exclude, str) else set(exclude)
    t = ReservationRow.__table__  # columns, not ORM objects: this runs under the write lock of every booking
    stmt = select(t.c.worker, t.c.gpu_index, t.c.vram, t.c.ram).where(t.c.worker.in_(workers),
                                                                     t.c.instance.notin_(gone))
    for r in session.connection().execute(stmt):
        a = out.setdefault(r.worker, Allocated())
        a.ram += r.ram
        if r.gpu_index >= 0:
            a.vram[r.gpu_index] = a.vram.get(r.gpu_index, 0) + r.vram
    return out


def check(workers: dict[str, WorkerRow], booked: dict[str, Allocated], rows: list[ReservationRow]) -> list[str]:
    """Why ``rows`` do not fit beside what is booked (empty: they fit)."""
    problems: list[str] = []
    need: dict[str, Allocated] = {}
    for r in rows:
        a = need.setdefault(r.worker, Allocated())
        a.ram += r.ram
        if r.gpu_index >= 0:
            a.vram[r.gpu_index] = a.vram.get(r.gpu_index, 0) + r.vram
    for name, want in sorted(need.items()):
        row = workers.get(name)
        if row is None:
            problems.append(f"worker {name} is not in the store")
            continue
        if row.state != "ready":
            problems.append(f"worker {name} is {row.state}")
            continue
        if row.cordoned:  # cordoned after the decision was made: no new booking there
            problems.append(f"host {name} is cordoned")
            continue
        try:
            model = worker_model(row)
        except ValidationError as e:
            problems.append(f"worker {name}'s report does not validate: {e.errors()[0]['msg'] if e.errors() else e}")
            continue
        free = allocatable(model, booked.get(name))
        for idx, b in sorted(want.vram.items()):
            if idx not in free.vram:
                problems.append(f"worker {name} has no GPU {idx}")
            elif b > free.vram[idx]:
                problems.append(f"worker {name} GPU {idx}: needs {gib(b)} GiB, {gib(free.vram[idx])} GiB free")
        if want.ram > free.ram:
            problems.append(f"worker {name} RAM: needs {gib(want.ram)} GiB, {gib(free.ram)} GiB free")
    return problems


def reserve(engine: Engine, instance: str, plan: PlacementPlan, reason: str = "", decision: dict | None = None,
            state: str = "scheduled", backend: str | None = None) -> tuple[PlacementPlan, bool]:
    """Book ``plan`` for ``instance``: returns (the plan booked, booked now?). False: this exact
    plan was already held. Raises StaleDecision when it does not fit, NotWanted when the instance is
    not one its deployment wants (nothing is written). The instance's row is ``state``
    (SCHEDULED, or STARTING when its launch follows at once) in the same transaction, with
    ``reason``, ``decision`` and the ``backend`` it is booked for."""
    out = reserve_many(engine, [Booking(instance, plan, reason, decision, state, backend)])[0]
    if isinstance(out, GpuflowError):
        raise out
    return out


@dataclass(frozen=True)
class Booking:
    instance: str
    plan: PlacementPlan
    reason: str = ""
    decision: dict | None = None
    state: str = "scheduled"
    backend: str | None = None  # the spec's: which parts the booking names (None: any, as before it was stored)


def reserve_many(engine: Engine, bookings: list[Booking]) -> list[tuple[PlacementPlan, bool] | StaleDecision | NotWanted]:
    """``reserve`` for several instances in one transaction and one commit (a batch of placements:
    activities/place_batch.py). The workers of every plan are locked together first, in name
    order, so two batches cannot deadlock. Each plan is checked against the ledger as the bookings
    before it in the batch left it; one that does not fit gets its StaleDecision (or OverQuota), one
    not wanted its NotWanted, nothing of it written, and the others are booked."""
    return _reserve_all(engine, bookings, whole=False)


def reserve_group(engine: Engine, bookings: list[Booking]) -> list[tuple[PlacementPlan, bool]] | StaleDecision | NotWanted:
    """Every member of a prefill/decode group booked in ONE transaction, or none of them: as
    ``reserve_many``, but the first booking that does not fit, is over its tenant's limit (each
    member counted on top of those before it) or is not wanted rolls the whole transaction back,
    and its error is returned; nothing is written then. Otherwise each member's (plan, booked now)."""
    return _reserve_all(engine, bookings, whole=True)


def _reserve_all(engine: Engine, bookings: list[Booking], whole: bool):
    """The bookings in one transaction, workers locked in name order. A booking refused: with
    ``whole``, everything rolled back and its error returned; else its error in its place."""
    wanted = [plan_rows(b.instance, b.plan) for b in bookings]
    out: list = []
    with Session(engine) as s:
        workers = lock_workers(s, sorted({r.worker for rows in wanted for r in rows}))
        touched: dict[str, WorkerRow] = {}
        logged: list[tuple[str, bool]] = []  # the change log's lines, written together before the commit
        for b, rows in zip(bookings, wanted):
            try:
                now = reserve_in(s, workers, b, rows, logged)
            except (StaleDecision, NotWanted) as e:
                if whole:
                    s.rollback()  # the members booked before it go too: a group is admitted whole or not at all
                    return e
                out.append(e)
                continue
            out.append((b.plan, now))
            if now:
                touched.update((r.worker, workers[r.worker]) for r in rows)
        bump_workers(s, touched.values())
        changes.bump_many(s, logged)
        s.commit()
    return out



def reserve_in(s: Session, workers: dict[str, WorkerRow], b: Booking, wanted: list[ReservationRow],
               logged: list[tuple[str, bool]] | None = None) -> bool:
    """One booking inside the batch's transaction; True when it was booked now (False: held already).
    ``logged``: where its change-log line goes, for the caller to write with the batch's
    (changes.bump_many, in the same transaction); None: written now."""
    why = wanted_problem(s, b.instance)
    if why:
        raise NotWanted(why)
    held = held_rows(s, b.instance)
    if held and same_rows(held, wanted):
        return False
    mine = sorted({r.worker for r in wanted})
    problems = check({w: workers[w] for w in mine if w in workers}, _booked(s, mine, b.instance), wanted)
    if problems:
        raise StaleDecision(f"instance {b.instance}: the plan no longer fits: " + "; ".join(problems))
    quota = tenants.over_limit_in(s, b.instance, wanted, set())
    if quota:
        raise OverQuota(f"instance {b.instance}: {quota}")
    if held:  # a DELETE statement now: the unit of work would flush the INSERTs below first
        s.exec(delete(ReservationRow).where(ReservationRow.instance == b.instance))
    s.add_all(wanted)
    s.flush()  # the next booking of the batch reads the ledger with Core statements: they see these rows
    _mark_scheduled(s, b.instance, b.plan, b.reason, b.decision, b.state, b.backend, logged=logged)
    return True


def preempt(engine: Engine, instance: str, plan: PlacementPlan, victims: dict[str, PlacementPlan],
            reason: str, backend: str | None = None) -> tuple[PlacementPlan, bool]:
    """Move the victims' GPUs to ``instance`` in one transaction: their ledger lines deleted,
    ``plan`` booked, so no third replica can take what they free. Under the locks of every worker
    touched, each victim must still hold exactly what the decision assumed (``victims``: name ->
    the placement it held in the snapshot), ``plan`` must fit beside the rest, and the tenant's
    limits must hold; else StaleDecision (nothing written). Idempotent like ``reserve``: the same
    plan already held returns (plan, False). The victims' rows keep their state (their processes
    still run until their workflows stop them) with ``reason``, and no placement. NotWanted (nothing
    written) when ``instance`` is not one its deployment wants. ``backend``: the one it is booked
    for; None: its deployment's spec's."""
    wanted = plan_rows(instance, plan)
    with Session(engine) as s:
        why = wanted_problem(s, instance)
        if why:
            raise NotWanted(why)
        held = list(s.exec(select(ReservationRow).where(ReservationRow.instance == instance)))
        if held and same_rows(held, wanted):
            return plan, False
        theirs = {v: plan_rows(v, p) for v, p in victims.items()}
        names = {r.worker for r in wanted} | {r.worker for rows in theirs.values() for r in rows}
        workers = lock_workers(s, sorted(names))
        for v, rows in sorted(theirs.items()):
            have = list(s.exec(select(ReservationRow).where(ReservationRow.instance == v)))
            if not have or not same_rows(have, rows):
                raise StaleDecision(f"instance {instance}: victim {v} no longer holds what the decision took from it")
        gone = set(victims)
        problems = check(workers, _booked(s, list(workers), gone | {instance}), wanted)
        if problems:
            raise StaleDecision(f"instance {instance}: the plan does not fit even without its victims: "
                                + "; ".join(problems))
        why = tenants.reclaim_problem_in(s, instance, wanted, theirs)
        if why:
            raise StaleDecision(f"instance {instance}: {why}")
        quota = tenants.over_limit_in(s, instance, wanted, gone)
        if quota:
            raise OverQuota(f"instance {instance}: {quota}")
        s.exec(delete(ReservationRow).where(ReservationRow.instance.in_(gone | {instance})))
        s.add_all(wanted)
        bump_workers(s, workers.values())
        mark_victims(s, gone, reason)
        _mark_scheduled(s, instance, plan, backend=backend or _spec_backend(s, instance))
        s.commit()
        return plan, True


def mark_victims(s: Session, victims, reason: str) -> None:
    """Preempted instances' rows: no placement any more, the preemption as their reason."""
    for v in sorted(victims):
        row = s.get(InstanceRow, v)
        if row is not None:
            row.placement, row.reason, row.updated_at = None, reason, utcnow()
            s.add(row)
        changes.bump(s, v)


def _spec_backend(s: Session, instance: str) -> str | None:
    """The backend of ``instance``'s deployment's spec (a preemption's booking carries no spec)."""
    row = s.get(InstanceRow, instance)
    dep = s.get(DeploymentRow, row.deployment) if row is not None else None
    backend = dep.spec.get("backend") if dep is not None and isinstance(dep.spec, dict) else None
    return backend if isinstance(backend, str) else None


def _mark_scheduled(s: Session, instance: str, plan: PlacementPlan, reason: str = "",
                    decision: dict | None = None, state: str = "scheduled", backend: str | None = None,
                    logged: list[tuple[str, bool]] | None = None) -> None:
    """The booked instance's row, in the booking's transaction: SCHEDULED (or ``state``) with its
    placement, out of the PENDING queue (a later return is a new arrival). A Core statement: it
    runs under the write lock of every booking."""
    t = InstanceRow.__table__
    vals = dict(state=state, reason=reason, updated_at=utcnow(), queued_at=None, worker=plan.worker,
                gpu_indexes=list(plan.gpu_indexes), placement=plan.model_dump(mode="json"), backend=backend)
    if decision is not None:
        vals["decision"] = decision
    s.connection().execute(update(t).where(t.c.name == instance).values(**vals))
    if logged is None:
        changes.bump(s, instance)
    else:
        logged.append((instance, False))


def bump_workers(s: Session, workers) -> None:
    for w in workers:
        w.generation += 1
        s.add(w)


def release(engine: Engine, instance: str) -> int:
    """Drop every ledger line of ``instance``; returns how many there were."""
    with Session(engine) as s:
        held = list(s.exec(select(ReservationRow.worker).where(ReservationRow.instance == instance)))
        if held:
            bump_workers(s, lock_workers(s, sorted(set(held))).values())
        n = s.exec(delete(ReservationRow).where(ReservationRow.instance == instance)).rowcount
        row = s.get(InstanceRow, instance)
        changed = bool(held)
        if row is not None and row.placement is not None:
            row.placement = None
            s.add(row)
            changed = True
        if changed:
            changes.bump(s, instance)
        s.commit()
        return n or 0


def workers_of(engine: Engine, instance: str) -> list[str]:
    """The workers ``instance`` holds ledger lines on (its main worker and its subordinates')."""
    with Session(engine) as s:
        return sorted(set(s.exec(select(ReservationRow.worker).where(ReservationRow.instance == instance))))


def instances_on(engine: Engine, worker: str) -> list[str]:
    """The instances holding ledger lines on ``worker`` (placed there, as main or subordinate)."""
    with Session(engine) as s:
        return sorted(set(s.exec(select(ReservationRow.instance).where(ReservationRow.worker == worker))))


def booked_per_gpu(engine: Engine) -> dict[tuple[str, int], int]:
    """(worker, GPU index) -> VRAM bytes booked; for invariant checks and metrics."""
    out: dict[tuple[str, int], int] = {}
    with Session(engine) as s:
        for r in s.exec(select(ReservationRow).where(ReservationRow.gpu_index >= 0)):
            out[(r.worker, r.gpu_index)] = out.get((r.worker, r.gpu_index), 0) + r.vram
    return out


def overbooked(engine: Engine) -> list[str]:
    """Every GPU or worker whose ledger exceeds total - system reserve (the invariant: empty).
    One read: the same per-worker sums the reservation check uses."""
    with Session(engine) as s:
        workers = {w.name: w for w in s.exec(select(WorkerRow))}
        booked = _booked(s, list(workers) + _unknown_workers(s, workers), exclude="")
    bad = []
    for w, a in sorted(booked.items()):
        wr = workers.get(w)
        for idx, b in sorted(a.vram.items()):
            gpu = next((g for g in (wr.gpus if wr else []) if g["index"] == idx), None)
            cap = (gpu["vram_total"] - wr.reserved_vram) if gpu else 0
            if b > cap:
                bad.append(f"{w} GPU {idx}: {b} booked > {cap}")
        cap = (wr.ram_total - wr.reserved_ram) if wr else 0
        if a.ram > cap:
            bad.append(f"{w} RAM: {a.ram} booked > {cap}")
    return bad


def _unknown_workers(s: Session, known: dict[str, WorkerRow]) -> list[str]:
    """Workers the ledger books on that the store does not know (each is overbooked by definition)."""
    return sorted(set(s.exec(select(ReservationRow.worker))) - set(known))
