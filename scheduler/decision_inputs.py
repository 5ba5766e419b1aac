"""What a placement decision saw, and the policy run on it: the same code decides (the control
plane's decider) and replays a decision later (``gpuflow explain --replay``, bench/replay_all.py).

``DecisionInputs`` is everything the pure policy reads: the snapshot (workers, instances, model
files, with the placements the decider assumed laid over it), the spec and its request, the
tenants file and the owners, the replica's name (or its group's, for replicas that preempt
together), the policy's weights and the worker generations. ``admissions`` runs the policy on
them: each replica's admission (scheduler/tenancy/admit.py; replicas of one deployment that
preempt together: group.py). How an admission shows in the record the workflow keeps is the
contract's (contracts/decision_of.py); how the inputs are kept is the store's
(store/decision_codec.py). ``dict_differences`` says where two recorded outcomes differ.

Pure, as kube-scheduler keeps its scheduling cycle (``framework/runtime/``) apart from the cache
that feeds it (``backend/cache/``): nothing here reads a store or a clock."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from scheduler.cluster import ClusterSnapshot
from scheduler.policy_config import PolicyConfig
from scheduler.request import Request
from scheduler.spec import ModelSpec
from scheduler.tenancy.admit import Admission, admit
from scheduler.tenancy.config import TenantsFile
from scheduler.tenancy.group import admit_group
from scheduler.tenancy.preemption import Owners


@dataclass
class DecisionInputs:
    snapshot: ClusterSnapshot
    spec: ModelSpec
    request: Request
    tenants: TenantsFile
    owners: Owners
    names: list[str]  # the replica decided, or the replicas of one deployment decided together (in order)
    policy: PolicyConfig
    gens: dict[str, int]  # worker -> generation the snapshot reflects


def admissions(inp: DecisionInputs) -> list[Admission]:
    """The admissions of ``inp.names``, in order: one replica alone, or the replicas of one
    deployment that preempt together."""
    snap, spec, req = inp.snapshot, inp.spec, inp.request
    if len(inp.names) == 1:
        return [admit(snap, spec, req, inp.tenants, inp.owners, inp.names[0], inp.policy)]
    return admit_group(snap, spec, req, inp.tenants, inp.owners, inp.names, inp.policy)


def dict_differences(a: Any, b: Any) -> list[str]:
    """Where JSON-like ``b`` differs from ``a``, as 'path: was -> now' lines; [] when the same."""
    out: list[str] = []
    _diff("", a, b, out)
    return out


def _diff(path: str, a: Any, b: Any, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            _diff(f"{path}.{k}" if path else str(k), a.get(k), b.get(k), out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(f"{path}[{i}]", x, y, out)
    elif a != b:
        out.append(f"{path}: {_short(a)} -> {_short(b)}")


def _short(v: Any) -> str:
    s = json.dumps(v)
    return s if len(s) <= 200 else s[:197] + "..."
