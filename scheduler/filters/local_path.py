"""For a local_path model that pins GPUs, drop workers known not to have the path.

As GPUStack, the filter runs only when ``gpu_selector.gpu_ids`` is set. GPUStack then asks each
worker whether the path exists; the snapshot's model_files rows are our answer: a row in error
says the worker could not find or read the path, so it goes. A READY row proves the path is
there, and a missing row proves nothing (shared storage may hold the path everywhere, and the
store records no local-path rows), so both stay.
"""

from scheduler.cluster import FileState
from scheduler.filters.chain import verdict

NAME = "local_path"


def run(ctx, workers):
    path = ctx.spec.source.local_path
    if not path or not ctx.spec.gpu_selector.gpu_ids:
        return verdict(NAME, workers, {})
    broken = {f.worker for f in ctx.snapshot.model_files if f.source == path and f.state == FileState.ERROR}
    removed = {w.name: [f"model path {path!r} is in error on this worker"] for w in workers if w.name in broken}
    note = None
    if removed:
        names = sorted(removed)
        note = (f"The model file path '{path}' does not exist on the following workers: {', '.join(names[:3])}"
                + (f"... (+{len(names) - 3} more)" if len(names) > 3 else "") + ".")
    return verdict(NAME, workers, removed, note)
