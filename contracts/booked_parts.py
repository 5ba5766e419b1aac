"""Which processes a booking lets each host run: one booking, one set of processes. Pure: the
ledger's read (store/ledger.py ``bookings_on``) calls it with the instance's stored placement and
the backend it was booked for; the agent starts nothing else (worker_agent/bookings.py) and its
orphan check stops anything else (worker_agent/reconcile.py).

The parts are those contracts/launch_parts.py launches, named the same way:

| backend | main worker | subordinate i's worker |
| --- | --- | --- |
| any, on one worker | "" (server) | |
| llama.cpp | "" (server) | rpc{i} (rpc-server, its one GPU) |
| vllm | "" (server), ray-head (ray-head, the main GPUs) | ray{i} (ray-worker) |
| sglang | "" (server: rank 0) | node{i+1} (sglang-node) |

A part's GPUs are its entry's GPUs and the GPUs its claim books (what the ledger's lines hold).
A booking made before the backend was stored (``backend`` None) allows, across workers, the
helpers of every backend that launches across workers; on one worker, still only the server.
"""

from __future__ import annotations

from contracts.decision import PlacementPlan
from contracts.host import BookedPart
from scheduler.cluster import Claim

ACROSS = ("llama.cpp", "vllm", "sglang")  # launch_parts.LAUNCHES_ACROSS_WORKERS


def _gpus(gpu_indexes: list[int], claim: Claim) -> list[int]:
    return sorted(set(gpu_indexes) | set(claim.vram))


def helpers(backend: str | None, i: int, gpus: list[int]) -> list[BookedPart]:
    """The helper(s) subordinate entry ``i`` of a placement runs for ``backend`` (None: any)."""
    named = {"llama.cpp": BookedPart(part=f"rpc{i}", role="rpc-server", gpu_indexes=gpus),
             "vllm": BookedPart(part=f"ray{i}", role="ray-worker", gpu_indexes=gpus),
             "sglang": BookedPart(part=f"node{i + 1}", role="sglang-node", gpu_indexes=gpus)}
    return list(named.values()) if backend is None else [named[backend]] if backend in named else []


def booked_parts(backend: str | None, plan: PlacementPlan, worker: str) -> list[BookedPart]:
    """The processes ``plan``, booked for ``backend``, lets ``worker`` run, in launch order."""
    out: list[BookedPart] = []
    across = bool(plan.subordinates) and (backend is None or backend in ACROSS)
    if plan.worker == worker:
        main = _gpus(plan.gpu_indexes, plan.claim)
        if across and backend in (None, "vllm"):
            out.append(BookedPart(part="ray-head", role="ray-head", gpu_indexes=main))
        out.append(BookedPart(part="", role="server", gpu_indexes=main))
    if across:
        for i, s in enumerate(plan.subordinates):
            if s.worker == worker:
                out += helpers(backend, i, _gpus(s.gpu_indexes, s.claim))
    return out
