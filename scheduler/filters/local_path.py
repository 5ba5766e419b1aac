"""For a local_path model, drop workers known not to have the path.

Two kinds of evidence, two rules:
- GPUStack's: when the model pins GPUs (``gpu_selector.gpu_ids``), a worker whose model_files row
  for the path is in error goes. A READY row proves the path is there; a missing row proves
  nothing (shared storage may hold the path everywhere), so both stay. Without ``gpu_ids`` the
  filter keeps everyone, as GPUStack's does.
- Ours, where GPUStack has none: the control plane asks the agents of the hosts that could run
  the model to read the path (activities/host_estimate.py) and records each answer, READY or
  MISSING. A MISSING row goes; a worker with no row has not been asked yet (it joined later, say)
  and stays, so the next read asks it.
"""

from scheduler.cluster import FileState
from scheduler.filters.chain import verdict

NAME = "local_path"


def run(ctx, workers):
    path = ctx.spec.source.local_path
    if not path:
        return verdict(NAME, workers, {})
    rows = {f.worker: f.state for f in ctx.snapshot.model_files if f.source == path}
    pinned = bool(ctx.spec.gpu_selector.gpu_ids)
    removed = {}
    for w in workers:
        state = rows.get(w.name)
        if state == FileState.MISSING:
            removed[w.name] = [f"model path {path!r} is not on this worker (its agent looked)"]
        elif state == FileState.ERROR and pinned:
            removed[w.name] = [f"model path {path!r} is in error on this worker"]
    note = None
    if removed:
        names = sorted(removed)
        note = (f"The model file path '{path}' does not exist on the following workers: {', '.join(names[:3])}"
                + (f"... (+{len(names) - 3} more)" if len(names) > 3 else "") + ".")
    return verdict(NAME, workers, removed, note)
