"""How a placement across several workers is launched: which helper processes run where, in which
order, and what the inference server is then told. Pure: the instance workflow calls these and
does the launching.

| backend | step 1 | step 2 | server on the main worker |
| --- | --- | --- | --- |
| llama.cpp | rpc-server on each subordinate GPU (its GPU visible) | | --rpc h:p,... --tensor-split rpc...,main... |
| vllm | Ray head on the main worker (its GPUs visible) | ray start --address head on each subordinate | --distributed-executor-backend ray, TP = main GPUs, PP = workers |

The scheduler's RPC candidate lists its subordinates in tensor-split order (RPC devices come
first in llama.cpp's device list), so rpc_servers keep that order. SGLang and custom commands
across several workers are refused with a reason.
"""

from __future__ import annotations

from scheduler.cluster import Subordinate
from worker_agent.payloads import LaunchRequest

LAUNCHES_ACROSS_WORKERS = ("llama.cpp", "vllm")


def unsupported(req: LaunchRequest) -> str | None:
    """Why this backend cannot be launched across several workers, or None."""
    if req.backend in LAUNCHES_ACROSS_WORKERS:
        return None
    return (f"backend {req.backend} is not launched across several workers (llama.cpp over RPC and vLLM over "
            "Ray are); set distributed_inference_across_workers: false or give it GPUs on one worker")


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
