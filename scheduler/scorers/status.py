"""Scale-down status: 0 for an ERROR instance or one on a worker that is not ready (or gone),
100 for a RUNNING instance on a READY worker, 50 otherwise (starting, unreachable, ...)."""

from scheduler.cluster import Instance, InstanceState, Worker, WorkerState


def score(inst: Instance, worker: Worker | None) -> float:
    if worker is None or worker.state == WorkerState.NOT_READY or inst.state == InstanceState.ERROR:
        return 0.0
    if worker.state == WorkerState.READY and inst.state == InstanceState.RUNNING:
        return 100.0
    return 50.0
