"""Estimating a local model path from what a GPU host read (worker_agent/model_header.py): the
control plane picks the hosts to ask (scheduler/model_readers.py), records which of them have
the path (the local-path filter then keeps only those), and costs the inputs they sent. The
control plane itself never opens the path: in a cluster it is not the GPU host. The activities
that call these are activities/hosts.py's ``model_readers`` and ``record_model_paths``.

| machine | reads |
| --- | --- |
| GPU host (agent) | the local path: GGUF header and tensor infos, or config.json (sent as parsed parameters) and safetensors headers |
| control plane | hub headers (hub_headers.py); never a local path: what a host sent is data |
"""

from __future__ import annotations

from sqlalchemy.engine import Engine
from sqlmodel import Session

from store import changes
from store.snapshot import load_snapshot
from store.tables import ModelFileRow, utcnow
from scheduler.estimate import request_from_inputs
from contracts.estimate_inputs import EstimateInputs, ReaderHosts
from scheduler.model_codec import decode_params
from scheduler.model_readers import reader_hosts
from scheduler.request import Request
from scheduler.spec import ModelSpec


def request_from_host(spec: ModelSpec, inputs: EstimateInputs) -> Request:
    """The request from a host's read (a directory's parameters came parsed: no file here)."""
    params = decode_params(inputs.params.model_dump()) if inputs.params is not None else None
    return request_from_inputs(spec, inputs, params)


def readers(engine: Engine, spec: ModelSpec) -> ReaderHosts:
    hosts, verdicts = reader_hosts(load_snapshot(engine), spec)
    reasons = [f"{v.name}: worker {w}: {r}" for v in verdicts for w, rs in v.removed.items() for r in rs]
    return ReaderHosts(hosts=hosts, reasons=reasons)


def record_paths(engine: Engine, path: str, present: list[str], missing: list[str]) -> None:
    """Which hosts hold ``path`` (ready) and which looked and did not find it (missing)."""
    with Session(engine) as s:
        for worker, state in [(w, "ready") for w in present] + [(w, "missing") for w in missing]:
            row = s.get(ModelFileRow, (worker, path)) or ModelFileRow(worker=worker, source=path)
            row.state, row.updated_at = state, utcnow()
            s.add(row)
        changes.bump(s, "", files=True)  # the snapshot caches reload model files: the local-path filter reads them
        s.commit()
