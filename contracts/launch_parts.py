"""How a placement across several workers is launched: which helper processes run where, in which
order, and what the inference server is then told. Pure: the instance workflow calls these and
does the launching.

| backend | step 1 | step 2 | server on the main worker |
| --- | --- | --- | --- |
| llama.cpp | rpc-server on each subordinate GPU (its GPU visible) | | --rpc h:p,... --tensor-split rpc...,main... |
| vllm | Ray head on the main worker (its GPUs visible) | ray start --address head on each subordinate | --distributed-executor-backend ray, TP = main GPUs, PP = workers |
| sglang | the server as rank 0, started without waiting (its agent picks the --dist-init-addr port) | rank i on subordinate i, --dist-init-addr rank 0 | then waited for: ready once every node joined; TP = all GPUs |

The scheduler's RPC candidate lists its subordinates in tensor-split order (RPC devices come
first in llama.cpp's device list), so rpc_servers keep that order. Custom commands across
several workers are refused with a reason.
"""

from __future__ import annotations

from scheduler.cluster import Subordinate
from contracts.agent import LaunchRequest

LAUNCHES_ACROSS_WORKERS = ("llama.cpp", "vllm", "sglang")


def unsupported(req: LaunchRequest) -> str | None:
    """Why this backend cannot be launched across several workers, or None."""
    if req.backend in LAUNCHES_ACROSS_WORKERS:
        return None
    return (f"backend {req.backend} is not launched across several workers (llama.cpp over RPC, vLLM over Ray "
            "and SGLang are); set distributed_inference_across_workers: false or give it GPUs on one worker")


def _helper(req: LaunchRequest, role: str, part: str, gpu_indexes: list[int], **more) -> LaunchRequest:
    return LaunchRequest(instance=req.instance, model=req.model, backend=req.backend, role=role, part=part,
                         gpu_indexes=gpu_indexes, gpu_vendor=req.gpu_vendor, env=dict(req.env),
                         ready_timeout_s=req.ready_timeout_s, settle_s=req.settle_s, distributed=True, **more)


def rpc_servers(req: LaunchRequest, subs: list[Subordinate]) -> list[tuple[str, LaunchRequest]]:
    """llama.cpp: one rpc-server per subordinate entry (one GPU each), as (worker, request)."""
    return [(s.worker, _helper(req, "rpc-server", f"rpc{i}", list(s.gpu_indexes))) for i, s in enumerate(subs)]


def ray_head(req: LaunchRequest) -> LaunchRequest:
    """vLLM: the Ray head, on the main worker with the main GPUs."""
    return _helper(req, "ray-head", "ray-head", list(req.gpu_indexes))


def ray_workers(req: LaunchRequest, subs: list[Subordinate], head: str) -> list[tuple[str, LaunchRequest]]:
    """vLLM: a Ray worker joining ``head`` (host:port) on each subordinate worker, its GPUs visible."""
    return [(s.worker, _helper(req, "ray-worker", f"ray{i}", list(s.gpu_indexes), ray_address=head))
            for i, s in enumerate(subs)]


def server_over_rpc(req: LaunchRequest, endpoints: list[str]) -> LaunchRequest:
    return req.model_copy(update={"rpc_servers": list(endpoints)})


def server_over_ray(req: LaunchRequest, head: str, workers: int) -> LaunchRequest:
    return req.model_copy(update={"ray_address": head, "pipeline_parallel": workers})


def sglang_head(req: LaunchRequest, subs: list[Subordinate]) -> LaunchRequest:
    """SGLang: the server as rank 0 of 1 + len(subs) nodes, started without waiting for it."""
    total = len(req.gpu_indexes) + sum(len(s.gpu_indexes) for s in subs)
    return req.model_copy(update={"nnodes": 1 + len(subs), "node_rank": 0, "tp_total": total, "wait_ready": False})


def sglang_nodes(head: LaunchRequest, subs: list[Subordinate], dist_init_addr: str) -> list[tuple[str, LaunchRequest]]:
    """SGLang: rank i + 1 on subordinate i, the same command with its own GPUs and memory fraction."""
    return [(s.worker, head.model_copy(update={
        "role": "sglang-node", "part": f"node{i + 1}", "gpu_indexes": list(s.gpu_indexes), "node_rank": i + 1,
        "vram_utilization": s.claim.vram_utilization, "dist_init_addr": dist_init_addr, "wait_ready": True,
        "cpu_pinning": False, "cpus": None, "numa_nodes": None}))  # the placement's CPUs are the main worker's
        for i, s in enumerate(subs)]


def sglang_server(head: LaunchRequest, dist_init_addr: str) -> LaunchRequest:
    """SGLang: rank 0 again, now waited for (its agent adopts the process it started)."""
    return head.model_copy(update={"dist_init_addr": dist_init_addr, "wait_ready": True})
