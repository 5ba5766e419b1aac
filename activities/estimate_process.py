"""Estimation in a child process that is killed when it runs too long or is no longer wanted.

A model file is untrusted input. The header checks (scheduler/gguf/sanity.py,
scheduler/hf/sanity.py) bound every loop by values that were checked against the tensors
present. If a file still gets past them, the estimate must not keep a control-plane thread
spinning: a Python thread cannot be stopped from outside, and a process can. So the estimate
runs in a child forked from a forkserver that has already imported the estimator (a fork costs
milliseconds; nothing of the parent's threads or locks is inherited). The child is killed when
the timeout passes (GPUFLOW_LIMITS__ESTIMATE_TIMEOUT_S) or when ``cancel`` is set: the activity
was cancelled, say because the instance was stopped. About 70-140 ms per estimate on this
machine (fork, result pickled back); estimates are cached per spec and file mtime.
As with any multiprocessing start method but fork, the program's main module must guard its
entry point with ``if __name__ == "__main__"`` (``gpuflow``'s console script does)."""

from __future__ import annotations

import multiprocessing
import threading
import time

from scheduler.errors import GpuflowError, InvalidInput
from scheduler.request import Request
from scheduler.spec import ModelSpec

_CTX = multiprocessing.get_context("forkserver")
_CTX.set_forkserver_preload(["__main__", "scheduler.estimate"])  # __main__: not re-imported per child
POLL_S = 0.1


class EstimateTimedOut(InvalidInput):
    """The estimate ran past its time: the model file is the likely cause (not retried)."""


class EstimateCancelled(GpuflowError):
    """The estimate was no longer wanted; its process was killed."""


def _child(conn, spec_json: str, path_override: str | None) -> None:
    from scheduler.estimate import estimate_request

    try:
        conn.send(("ok", estimate_request(ModelSpec.model_validate_json(spec_json), path_override)))
    except GpuflowError as e:
        conn.send(("invalid" if isinstance(e, InvalidInput) else "error", str(e)))
    except Exception as e:  # noqa: BLE001  a bug or a file the checks missed: named, not a traceback
        conn.send(("error", f"estimating failed: {type(e).__name__}: {e}"))
    finally:
        conn.close()


def estimate_in_child(spec: ModelSpec, path_override: str | None, timeout_s: float,
                      cancel: threading.Event | None = None) -> Request:
    """``estimate_request(spec, path_override)``, run in a child process that is killed after
    ``timeout_s`` seconds or as soon as ``cancel`` is set."""
    ours, theirs = _CTX.Pipe(duplex=False)
    p = _CTX.Process(target=_child, args=(theirs, spec.model_dump_json(), path_override), daemon=True,
                     name=f"gpuflow-estimate {spec.name}")
    p.start()
    theirs.close()
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if cancel is not None and cancel.is_set():
                raise EstimateCancelled(f"the estimate of {spec.source.key} was cancelled")
            if ours.poll(POLL_S):
                break
            if time.monotonic() > deadline:
                raise EstimateTimedOut(
                    f"estimating {spec.source.key} took longer than {timeout_s:g} s and was stopped; its header "
                    "is probably wrong (or raise GPUFLOW_LIMITS__ESTIMATE_TIMEOUT_S)")
            if not p.is_alive() and not ours.poll(0):
                raise GpuflowError(f"the estimator process for {spec.source.key} died (exit code {p.exitcode})")
        try:
            kind, value = ours.recv()
        except EOFError:
            raise GpuflowError(f"the estimator process for {spec.source.key} died (exit code {p.exitcode})") from None
    finally:
        ours.close()
        if p.is_alive():
            p.kill()
        p.join(5)
    if kind == "ok":
        return value
    raise (InvalidInput if kind == "invalid" else GpuflowError)(value)


def alive_children() -> list[str]:
    """Names of estimator processes still running (for tests: none once an estimate is over)."""
    return [c.name for c in multiprocessing.active_children() if c.name.startswith("gpuflow-estimate")]
