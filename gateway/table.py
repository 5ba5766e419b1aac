"""The routing table: for each deployment, its RUNNING replicas and the per-replica concurrency
limit. Built by a pure function from what the store holds (``routes()`` and the deployments'
specs); the gateway swaps the whole table at once, never edits it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from activities.store.serving import Route
from scheduler import params
from scheduler.errors import InvalidInput

# An engine's own limit on requests it runs at once, by backend: its flag names.
ENGINE_LIMIT_FLAGS: dict[str, tuple[str, ...]] = {
    "vllm": ("--max-num-seqs",),
    "llama.cpp": ("--parallel", "-np"),
    "sglang": ("--max-running-requests",),
}


@dataclass(frozen=True)
class Model:
    name: str
    limit: int  # requests in flight per replica
    replicas: tuple[Route, ...]


@dataclass(frozen=True)
class Table:
    models: dict[str, Model]
    version: int = 0

    def names(self) -> list[str]:
        return sorted(self.models)


def replica_limit(spec: dict[str, Any], default: int) -> int:
    """The engine's own flag where it has one, else the spec's ``max_concurrency``, else
    ``default``. A malformed flag is the deployment's problem: the default is used."""
    flags = ENGINE_LIMIT_FLAGS.get(str(spec.get("backend", "")), ())
    p = spec.get("backend_parameters") or []
    if flags and isinstance(p, list) and all(isinstance(x, str) for x in p):
        try:
            n = params.find_int(p, *flags, minimum=1)
        except InvalidInput:
            n = None
        if n:
            return n
    m = spec.get("max_concurrency")
    return m if isinstance(m, int) and not isinstance(m, bool) and m >= 1 else default


def build(routes: Iterable[Route], specs: dict[str, dict[str, Any]], default_limit: int, version: int = 0) -> Table:
    """Every deployment in ``specs`` (active ones) is routable, with or without replicas: a
    request for one with none waits for one. Routes of a deployment not in ``specs`` are left
    out (it is being deleted)."""
    by: dict[str, list[Route]] = {name: [] for name in specs}
    for r in routes:
        if r.deployment in by:
            by[r.deployment].append(r)
    return Table({name: Model(name, replica_limit(specs[name], default_limit), tuple(rs)) for name, rs in by.items()},
                 version)
