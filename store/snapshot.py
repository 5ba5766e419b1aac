"""Store rows -> the scheduler's ClusterSnapshot (the policy never sees a table)."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterable, Iterator

from pydantic import ValidationError
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from store.tables import InstanceRow, ModelFileRow, WorkerRow
from scheduler.cluster import ClusterSnapshot, Instance, ModelFile, Worker

LIVE = ("pending", "analyzing", "scheduled", "starting", "running", "error", "unreachable", "stopping")
DRAINING = "draining"  # leaving the routing table before it stops: the policy sees it as stopping


log = logging.getLogger("gpuflow.store")


def worker_model(row: WorkerRow) -> Worker:
    """The row as the policy's Worker; ValidationError when the stored report does not validate."""
    return Worker(name=row.name, state=row.state, cluster=row.cluster, labels=row.labels or {},
                  ram_total=row.ram_total, unified_memory=row.unified_memory,
                  reserved={"ram": row.reserved_ram, "vram": row.reserved_vram},
                  backends=row.backends, gpus=row.gpus or [], cordoned=bool(row.cordoned), commands=row.commands,
                  kv_connectors=row.kv_connectors)


def valid_workers(rows: Iterable[WorkerRow]) -> Iterator[Worker]:
    """The rows that make a valid Worker; any other is left out of the snapshot with a log line.
    A host is judged alone: its report is validated when the control plane takes it in, so a row
    that does not validate here was written by an older gpuflow, or by hand, and one such host
    must not stop placement everywhere (it had: "GPU index 0 appears twice" for every decision)."""
    for row in rows:
        try:
            yield worker_model(row)
        except ValidationError as e:
            log.warning("worker %s left out of the snapshot: its stored report does not validate: %s",
                        row.name, e.errors()[0]["msg"] if e.errors() else e)


def instance_model(row: InstanceRow) -> Instance:
    p = row.placement or {}
    state = "stopping" if row.state == DRAINING else row.state if row.state in LIVE else "error"
    return Instance(name=row.name, model=row.model, state=state,
                    worker=p.get("worker") or (row.worker if row.placement else None),
                    gpu_indexes=p.get("gpu_indexes", []), claim=p.get("claim", {}),
                    subordinates=p.get("subordinates", []), role=row.role, group=row.group_name)


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
        workers = list(valid_workers(s.exec(select(WorkerRow).order_by(WorkerRow.name))))
        insts = [instance_model(i) for i in s.exec(select(InstanceRow).where(InstanceRow.state.in_((*LIVE, DRAINING)))
                                                   .order_by(InstanceRow.name))]
        files = [ModelFile(worker=f.worker, source=f.source, state=f.state) for f in s.exec(select(ModelFileRow))]
    return ClusterSnapshot(workers=workers, instances=insts, model_files=files)
