"""Store rows -> the scheduler's ClusterSnapshot (the policy never sees a table)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from activities.store.tables import InstanceRow, ModelFileRow, WorkerRow
from scheduler.cluster import ClusterSnapshot, Instance, ModelFile, Worker

LIVE = ("pending", "analyzing", "scheduled", "starting", "running", "error", "unreachable", "stopping")
DRAINING = "draining"  # leaving the routing table before it stops: the policy sees it as stopping


def worker_model(row: WorkerRow) -> Worker:
    return Worker(name=row.name, state=row.state, cluster=row.cluster, labels=row.labels or {},
                  ram_total=row.ram_total, unified_memory=row.unified_memory,
                  reserved={"ram": row.reserved_ram, "vram": row.reserved_vram},
                  backends=row.backends, gpus=row.gpus or [])


def instance_model(row: InstanceRow) -> Instance:
    p = row.placement or {}
    state = "stopping" if row.state == DRAINING else row.state if row.state in LIVE else "error"
    return Instance(name=row.name, model=row.model, state=state,
                    worker=p.get("worker") or (row.worker if row.placement else None),
                    gpu_indexes=p.get("gpu_indexes", []), claim=p.get("claim", {}),
                    subordinates=p.get("subordinates", []))


@contextmanager
def session(bind: Engine | Session) -> Iterator[Session]:
    """A session on ``bind``; a Session passed in is used as it is (reads inside its transaction)."""
    if isinstance(bind, Session):
        yield bind
        return
    with Session(bind) as s:
        yield s


def generations(bind: Engine | Session) -> dict[str, int]:
    with session(bind) as s:
        return {n: g for n, g in s.exec(select(WorkerRow.name, WorkerRow.generation))}


def load_snapshot(bind: Engine | Session) -> ClusterSnapshot:
    """Workers as their agents last reported them; every live instance with the placement it
    holds in the ledger (an instance without one claims nothing)."""
    with session(bind) as s:
        workers = [worker_model(w) for w in s.exec(select(WorkerRow).order_by(WorkerRow.name))]
        insts = [instance_model(i) for i in s.exec(select(InstanceRow).where(InstanceRow.state.in_((*LIVE, DRAINING)))
                                                   .order_by(InstanceRow.name))]
        files = [ModelFile(worker=f.worker, source=f.source, state=f.state) for f in s.exec(select(ModelFileRow))]
    return ClusterSnapshot(workers=workers, instances=insts, model_files=files)
