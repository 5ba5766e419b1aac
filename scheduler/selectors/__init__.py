"""Candidate selectors per backend: a lookup table, not an if/elif ladder."""

from __future__ import annotations

from scheduler.decision import Context
from scheduler.selectors import custom, gguf, sglang, vllm
from scheduler.spec import Backend

BY_BACKEND = {Backend.VLLM: vllm, Backend.SGLANG: sglang, Backend.CUSTOM: custom, Backend.VOXBOX: custom}


def select(ctx: Context, workers, msgs: list[str]):
    """(strategy name, candidates) for the model; GGUF requests go to the GGUF strategies
    whatever the backend, as in GPUStack."""
    module = gguf if ctx.request.kind == "gguf" else BY_BACKEND[ctx.spec.backend]
    return module.select(ctx, workers, msgs)
