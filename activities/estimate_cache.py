"""The requests a control-plane worker has costed, by spec and file stamp: a model is costed once,
not once per decision. The placement activities fill it; the PENDING queue's wake and the
autoscaler's dry run read it (activities/wake_queue.py, activities/autoscale.py)."""

from __future__ import annotations

import os
import threading

from activities.estimate_process import estimate_in_child
from activities.host_estimate import request_from_host
from activities.hub_headers import header_copy
from scheduler.estimate import estimate_request, states_resources
from contracts.estimate_inputs import EstimateInputs
from contracts.limits import Limits
from scheduler.request import Request
from scheduler.spec import ModelSpec


class EstimateCache:
    """Requests by spec and file mtime: a model is costed once, not once per decision."""

    def __init__(self, hub_cache: str | None = None, hf_endpoint: str | None = None,
                 timeout_s: float = Limits().estimate_timeout_s) -> None:
        self._d: dict[tuple, Request] = {}
        self._lock = threading.Lock()
        self.hub_cache, self.hf_endpoint, self.timeout_s = hub_cache, hf_endpoint, timeout_s

    def get(self, spec: ModelSpec, inputs: EstimateInputs | None = None,
            cancel: threading.Event | None = None) -> Request:
        """The request, from the cache or costed now. ``inputs``: a local path as a GPU host read it
        (host_estimate.py; the control plane then opens nothing, and the header was checked
        against its tensors there). Otherwise a child process costs it (killed after
        ``timeout_s`` or once ``cancel`` is set: see activities/estimate_process.py); a spec that
        gives its resources is not costed from files, so it is estimated here, at once."""
        path = spec.source.local_path
        try:
            stamp = inputs.stamp() if inputs is not None else os.stat(path).st_mtime_ns if path else None
        except OSError:
            stamp = None
        key = (spec.model_dump_json(), stamp)
        with self._lock:
            hit = self._d.get(key)
        if hit is not None:
            return hit
        override = None
        if path is None and not states_resources(spec) and self.hub_cache:
            override = header_copy(spec.source, self.hub_cache, self.hf_endpoint)  # a hub model: its headers
        if inputs is not None:
            req = request_from_host(spec, inputs)
        elif states_resources(spec):  # nothing to cost: no child needed
            req = estimate_request(spec, override)
        else:
            req = estimate_in_child(spec, override, self.timeout_s, cancel)
        with self._lock:
            if len(self._d) > 256:
                self._d.clear()
            self._d[key] = req
        return req

    def peek(self, spec: ModelSpec) -> Request | None:
        """The request last costed for ``spec`` (whatever file stamp it was costed at), or None;
        never costs anything (the wake queue's view: activities/wake_queue.py)."""
        want = spec.model_dump_json()
        with self._lock:
            return next((r for (k, _), r in reversed(self._d.items()) if k == want), None)
