"""For a local_path model, keep workers known to hold the path.

Active when the model pins GPUs (as GPUStack) or when the snapshot says anything about the path
(some worker reports it in model_files): then a worker with no row, or a row in error, is out.
"""

from scheduler.cluster import FileState
from scheduler.filters.chain import verdict

NAME = "local_path"


def run(ctx, workers):
    path = ctx.spec.source.local_path
    if not path:
        return verdict(NAME, workers, {})
    rows = {f.worker: f for f in ctx.snapshot.model_files if f.source == path}
    if not rows and not ctx.spec.gpu_selector.gpu_ids:
        return verdict(NAME, workers, {})
    removed = {}
    for w in workers:
        row = rows.get(w.name)
        if row is None:
            removed[w.name] = [f"model path {path!r} is not reported on this worker"]
        elif row.state == FileState.MISSING:
            removed[w.name] = [f"model path {path!r} is not on this worker (its agent looked)"]
        elif row.state == FileState.ERROR:
            removed[w.name] = [f"model path {path!r} is in error on this worker"]
    note = None
    if removed:
        names = sorted(removed)
        note = (f"The model file path '{path}' does not exist on the following workers: {', '.join(names[:3])}"
                + (f"... (+{len(names) - 3} more)" if len(names) > 3 else "") + ".")
    return verdict(NAME, workers, removed, note)
