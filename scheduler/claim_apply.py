"""Which VRAM claim a new placement books: the estimate, or the claim learned from what the
deployment's replicas used (scheduler/claims/, issue 42). Pure: the learned state arrives as data,
read from the store by the caller (activities/claims_read.py).

The mode is the spec's ``claims`` (advise | apply), else the cluster's GPUFLOW_CLAIMS__MODE:
- ``advise`` never changes what is booked;
- ``apply`` books the learned claim in place of the estimate, once it is confident (or at once
  after an OOM or use over the claim bumped it), never below the weights. The request then
  carries the recommender's state (``LearnedClaim``), which the decision's kept inputs keep, so
  ``gpuflow explain --replay`` decides the same and says why.

Only a flat request (vLLM, SGLang, custom, VoxBox: one figure per replica) takes a learned claim.
A llama.cpp (GGUF) request is costed per offloaded layer, and a spec that fixes the engine's share
of the card itself (vLLM ``--gpu-memory-utilization``, SGLang ``--mem-fraction-static``) books
what it asked for: neither is changed, and ``why`` says so.

For vLLM and SGLang the learned claim replaces the whole-card fraction they book by default
(GPUStack's ``total x 0.9``): the selectors book the claim itself, in equal shares over the
replica's GPUs (tensor parallelism shards evenly), and the engine is told to take that share and
no more (``even_shares``: the fraction of the card the agent passes as --gpu-memory-utilization or
--mem-fraction-static, worker_agent/engines.py)."""

from __future__ import annotations

import math
from dataclasses import replace

from scheduler.errors import InvalidInput
from scheduler.learned_claim import LearnedClaim
from scheduler.params import find_float
from scheduler.request import FlatRequest, Request
from scheduler.units import gib

ADVISE, APPLY = "advise", "apply"
MODES = (ADVISE, APPLY)
OWN_SHARE = {"vllm": ("--gpu-memory-utilization",), "sglang": ("--mem-fraction-static",)}
UP_FRONT = tuple(OWN_SHARE)  # engines that allocate their share up front: told the booked claim


def mode_of(spec_mode: str | None, cluster_mode: str) -> str:
    """The spec's ``claims`` wins over the cluster's GPUFLOW_CLAIMS__MODE."""
    m = spec_mode or cluster_mode
    if m not in MODES:
        raise InvalidInput(f"claims mode {m!r} is not one of {', '.join(MODES)}")
    return m


def owns_share(backend: str, params: list[str]) -> str | None:
    """The flag by which a spec fixes its engine's share of the card itself, if it does."""
    return next((f for f in OWN_SHARE.get(backend, ()) if find_float(params, f) is not None), None)


def applied(req: Request, backend: str, params: list[str], learned: LearnedClaim | None,
            mode: str) -> tuple[Request, str]:
    """The request a new placement books, and why, in one line. ``learned``: the recommender's
    claim for this deployment, confident or bumped (None: none yet)."""
    if mode != APPLY:
        if learned is None:
            return req, "claims advise: the estimate is booked"
        return req, (f"claims advise: the estimate {gib(learned.estimate)} GiB is booked; the learned claim "
                     f"would be {gib(learned.claim)} GiB")
    if learned is None:
        return req, "claims apply: no confident learned claim yet; the estimate is booked"
    if not isinstance(req, FlatRequest):
        return req, "claims apply: a llama.cpp estimate is per offloaded layer; the estimate is booked"
    flag = owns_share(backend, params)
    if flag:
        return req, f"claims apply: the spec sets {flag}, so it books that share; the estimate is booked"
    floor = max(learned.floor, req.weight_bytes or 0)
    claim = max(learned.claim, floor)
    kept = replace(learned, claim=claim, estimate=req.vram, floor=floor)
    why = learned_text(kept)  # the request's basis: explain's "request:" line says it
    return replace(req, vram=claim, learned=kept, basis=why), f"claims apply: {why}"


def learned_text(c: LearnedClaim) -> str:
    """'claim 10.4 GiB learned from 1,240 samples over 3 days (p90 9.0 GiB + 15%); the estimate was 14.0 GiB'."""
    if c.bumped:
        how = "raised at once after an OOM or use over the claim"
    else:
        how = (f"learned from {c.samples:,} samples over {_span(c.span_s)} (p{c.percentile * 100:g} "
               f"{gib(c.value)} GiB + {c.margin * 100:g}%)")
    floor = f", held at the weights' {gib(c.floor)} GiB" if c.floor and c.claim == c.floor else ""
    return f"claim {gib(c.claim)} GiB {how}{floor}; the estimate was {gib(c.estimate)} GiB"


def _span(s: float) -> str:
    for unit, n in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if s >= 2 * n:
            return f"{s / n:.0f} {unit}"
    return f"{s:.0f} s"


def even_shares(claim: int, totals: list[int]) -> tuple[int, float]:
    """(bytes per GPU, the fraction of each card the engine is told) for a learned claim over GPUs
    of these totals: equal shares (tensor parallelism shards evenly), each rounded up to a MiB;
    the fraction rounded down to 4 decimals on the largest card, so no card takes more than its
    share (the agent writes it with 4 decimals)."""
    n = max(len(totals), 1)
    share = -(-claim // n)
    share = -(-share // 2**20) * 2**20
    frac = math.floor(share / max(totals) * 10_000) / 10_000 if totals and max(totals) else 0.0
    return share, min(frac, 1.0)


def is_oom(why: str) -> bool:
    """Whether an exit's reason (its log's tail) names a GPU out-of-memory: an engine's own
    (PyTorch's "CUDA out of memory", vLLM's OutOfMemoryError) or a simulated host's (sim_oom.py)."""
    w = why.lower()
    return "out of memory" in w or "outofmemoryerror" in w
