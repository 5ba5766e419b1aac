"""Reading engine flags out of a model's ``backend_parameters`` (``--k=v`` or ``--k v``; the
first occurrence wins, as GPUStack's ``find_parameter``)."""

from __future__ import annotations

import shlex
from dataclasses import replace

from scheduler.errors import InvalidInput
from scheduler.gguf.estimate import LlamaCppOptions


def _split(params: list[str]) -> list[str]:
    out: list[str] = []
    for p in params:
        out.extend(p.split("=", 1) if p.startswith("-") and "=" in p else [p])
    return out


def tokens(params: list[str]) -> list[str]:
    """The parameters as words, ``--k=v`` split into ``--k``, ``v``."""
    return _split(params)


def find(params: list[str], *names: str) -> str | None:
    toks = _split(params)
    for i, t in enumerate(toks):
        if t in names:
            if i + 1 >= len(toks) or toks[i + 1].startswith("--"):
                raise InvalidInput(f"backend parameter {t} needs a value")
            return toks[i + 1]
    return None


def has(params: list[str], *names: str) -> bool:
    return any(t in names for t in _split(params))


def find_int(params: list[str], *names: str, minimum: int | None = None) -> int | None:
    v = find(params, *names)
    if v is None:
        return None
    try:
        n = int(v)
    except ValueError:
        raise InvalidInput(f"backend parameter {names[0]} must be an integer, got {v!r}") from None
    if minimum is not None and n < minimum:
        raise InvalidInput(f"backend parameter {names[0]} must be >= {minimum}, got {n}")
    return n


def find_float(params: list[str], *names: str, low: float = 0.0, high: float = 1.0) -> float | None:
    v = find(params, *names)
    if v is None:
        return None
    try:
        x = float(v)
    except ValueError:
        raise InvalidInput(f"backend parameter {names[0]} must be a number, got {v!r}") from None
    if not low < x <= high:
        raise InvalidInput(f"backend parameter {names[0]} must be in ({low}, {high}], got {x}")
    return x


def llama_cpp_options(params: list[str], base: LlamaCppOptions) -> tuple[LlamaCppOptions, int | None]:
    """The estimator options a llama-server command line implies, and its --gpu-layers (or None)."""
    o = base
    if (v := find_int(params, "--ctx-size", "-c", minimum=1)) is not None:
        o = replace(o, ctx_size=v)
    if (v := find_int(params, "--parallel", "-np", minimum=1)) is not None:
        o = replace(o, parallel_size=v)
    if (v := find_int(params, "--batch-size", "-b", minimum=1)) is not None:
        o = replace(o, batch_size=v)
    if (v := find_int(params, "--ubatch-size", "-ub", minimum=1)) is not None:
        o = replace(o, ubatch_size=v)
    if (v := find(params, "--cache-type-k", "-ctk")) is not None:
        o = replace(o, cache_type_k=v.lower())
    if (v := find(params, "--cache-type-v", "-ctv")) is not None:
        o = replace(o, cache_type_v=v.lower())
    if (v := find(params, "--flash-attn", "-fa")) is not None:  # on/off/auto (auto costed as off: more memory)
        o = replace(o, flash_attention=v.lower() in ("on", "enabled", "true", "1"))
    if has(params, "--no-mmap"):
        o = replace(o, mmap=False)
    if has(params, "--no-kv-offload", "-nkvo"):
        o = replace(o, offload_kv=False)
    if has(params, "--swa-full"):
        o = replace(o, swa_full=True)
    gpu_layers = find_int(params, "--gpu-layers", "-ngl", "--n-gpu-layers", minimum=-1)
    return o, gpu_layers


def user_tensor_split(params: list[str]) -> list[float] | None:
    v = find(params, "--tensor-split", "-ts")
    if v is None:
        return None
    try:  # llama-server splits on ',' or '/' (3,1 or 3/1)
        return [float(x) for x in v.replace("/", ",").split(",") if x]
    except ValueError:
        raise InvalidInput(f"backend parameter --tensor-split must be comma-separated numbers, got {v!r}") from None


def _product(sizes: list[int | None]) -> int | None:
    """The world size from the parallel sizes that were given (None when none was)."""
    given = [s for s in sizes if s]
    if not given:
        return None
    n = 1
    for s in given:
        n *= s
    return n


def vllm_world_size(params: list[str]) -> int | None:
    return _product([find_int(params, *names, minimum=1) for names in (
        ("--tensor-parallel-size", "-tp", "--tp"), ("--pipeline-parallel-size", "-pp", "--pp"),
        ("--data-parallel-size", "-dp", "--dp"), ("--prefill-context-parallel-size", "--pcp"))])


def sglang_world_size(params: list[str]) -> int | None:
    tp = find_int(params, "--tp-size", "--tensor-parallel-size", "--tp", minimum=1)
    pp = find_int(params, "--pp-size", "--pipeline-parallel-size", minimum=1)
    dp = None if has(params, "--enable-dp-attention") else find_int(params, "--dp-size", "--data-parallel-size", "--dp", minimum=1)
    return _product([tp, pp, dp])


def whole_card_fraction(run_command: str | None, params: list[str]) -> float | None:
    """Custom backend: the last --gpu-memory-utilization / --mem-fraction-static, kept if in (0, 1]."""
    toks = _split((shlex.split(run_command) if run_command else []) + list(params))
    frac = None
    for i, t in enumerate(toks[:-1]):
        if t in ("--gpu-memory-utilization", "--mem-fraction-static"):
            try:
                x = float(toks[i + 1])
            except ValueError:
                continue
            if 0 < x <= 1:
                frac = x
    return frac
