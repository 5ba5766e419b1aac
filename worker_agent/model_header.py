"""``read_model_header`` on the host's queue: the estimate inputs of a local model path, read on
the GPU host that has it (the control plane, which costs them, may not). Only paths under the
agent's ``--model-root`` dirs (when given) are read; only headers, never tensor data. Reads are
cached per path, mtime and size.

Errors (ApplicationError types, none retried): ModelPathMissing (not on this host, or not
readable), ModelPathRefused (outside the model roots), ModelError (there, but not a model the
estimator can read: the spec's fault).
"""

from __future__ import annotations

import asyncio
import os
import threading

from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from scheduler.errors import GpuflowError, InvalidInput
from contracts.estimate_inputs import EstimateInputs, HeaderRequest
from scheduler.model_codec import encode_header, encode_params
from scheduler.gguf.reader import read_header
from scheduler.hf.config import load_parameters
from scheduler.hf.safetensors_header import directory_weight_bytes
from worker_agent.engines import check_model_path
from contracts.agent import READ_MODEL_HEADER

CACHED = 64


def read_inputs(path: str, gguf: bool, worker: str = "") -> EstimateInputs:
    """What the estimator reads at ``path`` (GGUFHeader, or the parameters from config.json and the weight bytes)."""
    st = os.stat(path)
    base = dict(path=path, worker=worker, mtime_ns=st.st_mtime_ns, size=st.st_size)
    if gguf:
        return EstimateInputs(kind="gguf", gguf=encode_header(read_header(path)), **base)
    if not os.path.isdir(path):
        raise InvalidInput(f"{path}: not a model directory (expected config.json and weights)")
    weights, files = directory_weight_bytes(path)
    params = encode_params(load_parameters(path)) if os.path.isfile(os.path.join(path, "config.json")) else None
    return EstimateInputs(kind="hf", params=params, weight_bytes=weights,
                          weight_files=[os.path.relpath(f, path) for f in files], **base)


class ModelHeaders:
    def __init__(self, worker: str, model_roots: tuple[str, ...] = ()):
        self.worker, self.model_roots = worker, model_roots
        self._cache: dict[tuple, EstimateInputs] = {}
        self._lock = threading.Lock()

    @activity.defn(name=READ_MODEL_HEADER)
    async def read_model_header(self, req: HeaderRequest) -> EstimateInputs:
        return await asyncio.to_thread(self.read, req)

    def read(self, req: HeaderRequest) -> EstimateInputs:
        try:
            check_model_path(req.path, self.model_roots)
        except InvalidInput as e:
            raise ApplicationError(str(e), type="ModelPathRefused", non_retryable=True) from None
        try:
            st = os.stat(req.path)
        except OSError as e:
            raise ApplicationError(f"model path {req.path} is not on host {self.worker}: {e.strerror}",
                                   type="ModelPathMissing", non_retryable=True) from None
        key = (os.path.realpath(req.path), req.path, req.gguf, st.st_mtime_ns, st.st_size)
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None:
            return hit
        try:
            got = read_inputs(req.path, req.gguf, self.worker)
        except FileNotFoundError as e:  # gone (or a shard missing) between the stat and the read
            raise ApplicationError(f"model path {req.path} on host {self.worker}: {e.strerror}: {e.filename}",
                                   type="ModelPathMissing", non_retryable=True) from None
        except (GpuflowError, OSError) as e:
            raise ApplicationError(f"model path {req.path} on host {self.worker}: {e}", type="ModelError",
                                   non_retryable=True) from None
        except ValidationError as e:  # a figure past the contract's bounds (contracts/estimate_inputs.py): the file's
            first = e.errors()[0]
            raise ApplicationError(f"model path {req.path} on host {self.worker}: its header says what no model file "
                                   f"does: {'.'.join(map(str, first['loc']))}: {first['msg']}"[:2000],
                                   type="ModelError", non_retryable=True) from None
        with self._lock:
            if len(self._cache) >= CACHED:
                self._cache.clear()
            self._cache[key] = got
        return got
