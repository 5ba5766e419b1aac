"""llama.cpp's memory model for a GGUF model, as gguf-parser-go computes it (v0.25/0.26).

Device 0 is the CPU (RAM); devices 1..k are one per tensor-split entry, the first ``len(rpc)``
of them remote RPC servers. Every figure is in bytes. ``estimate`` gives one run (one offload
count); ``estimate_items`` gives the list gguf-parser prints for ``--gpu-layers-step``.
See ../shared/reference/estimation.md §1 for each formula.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace

from scheduler.errors import InvalidInput
from scheduler.gguf import types as T
from scheduler.gguf.model import GGUFModel
from scheduler.units import MiB, pad

_TENSOR_OVERHEAD = 32 + 368  # ggml object + ggml tensor


@dataclass(frozen=True)
class LlamaCppOptions:
    """Options named after gguf-parser's flags. Defaults are gguf-parser's CLI defaults."""

    ctx_size: int | None = None  # None: the model's trained context length
    in_max_ctx_size: bool = False
    parallel_size: int = 1
    batch_size: int = 2048
    ubatch_size: int = 512
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attention: bool = False
    mmap: bool = True
    gpu_layers: int = -1  # -1: all layers and the output layer
    tensor_split: tuple[float, ...] | None = None
    rpc: tuple[str, ...] = ()
    platform_ram: int = 150 * MiB
    platform_vram: int = 250 * MiB
    offload_kv: bool = True
    swa_full: bool = False

    def __post_init__(self):
        for name in ("cache_type_k", "cache_type_v"):
            if getattr(self, name) not in T.CACHE_TYPES:
                raise InvalidInput(f"{name.replace('_', '-')}: {getattr(self, name)!r} is not one of {', '.join(T.CACHE_TYPES)}")
        if self.ubatch_size <= 0 or self.batch_size <= 0:
            raise InvalidInput("batch-size and ubatch-size must be positive")
        if self.parallel_size <= 0:
            raise InvalidInput(f"parallel-size must be positive, got {self.parallel_size}")
        if self.ctx_size is not None and self.ctx_size <= 0:
            raise InvalidInput(f"ctx-size must be positive, got {self.ctx_size}")
        if self.tensor_split is not None and (not self.tensor_split or any(v < 0 for v in self.tensor_split) or sum(self.tensor_split) <= 0):
            raise InvalidInput(f"tensor-split {list(self.tensor_split)} must be non-negative numbers with a positive sum")
        if self.rpc and len(self.rpc) > len(self.tensor_split or (1,)):
            raise InvalidInput(f"--rpc lists {len(self.rpc)} servers but --tensor-split has only {len(self.tensor_split or (1,))} entries")


def gpustack_options(**overrides) -> LlamaCppOptions:
    """What GPUStack passes to gguf-parser when it schedules (ctx 8192, 4 sequences, no mmap, 150/500 MiB)."""
    base = dict(ctx_size=8192, parallel_size=4, mmap=False, platform_ram=150 * MiB, platform_vram=500 * MiB)
    base.update(overrides)
    return LlamaCppOptions(**base)


@dataclass
class Device:
    remote: bool = False
    position: int = 0
    handle_layers: int = 0
    handle_swa_layers: int = 0
    handle_last_layer: int = -1
    handle_output_layer: bool = False
    footprint: int = 0
    w_input: int = 0
    w_compute: int = 0
    w_output: int = 0
    kv: int = 0
    c_footprint: int = 0
    c_input: int = 0
    c_compute: int = 0
    c_output: int = 0

    @property
    def weight(self) -> int:
        return self.w_input + self.w_compute + self.w_output

    @property
    def computation(self) -> int:
        return self.c_footprint + self.c_input + max(self.c_compute, self.c_output)


@dataclass(frozen=True)
class Memory:
    handle_layers: int
    handle_last_layer: int
    handle_output_layer: bool
    uma: int
    nonuma: int
    remote: bool = False
    position: int = 0


@dataclass(frozen=True)
class EstimateItem:
    offload_layers: int  # offloaded layers, +1 when the output layer is offloaded too
    full_offloaded: bool
    ram: Memory
    vrams: tuple[Memory, ...]


@dataclass
class Run:
    devices: list[Device] = field(default_factory=list)
    offload_layers: int = 0
    full_offloaded: bool = False
    context_size: int = 0
    embedding_only: bool = False


def _graph_overhead(nodes: int) -> int:
    hs = (2 * nodes) | 1 if 2 * nodes < 65537 else 2  # gguf-parser's hash-size search, quirk kept
    g = 80 + 3 * pad(nodes * 8, 8) + pad(hs * 8, 8) + pad(((hs + 31) >> 5) * 4, 4)
    return 32 + pad(g, 16)


def _devices(opts: LlamaCppOptions) -> tuple[list[Device], list[float]]:
    split = list(opts.tensor_split or (1.0,))
    total = sum(split)
    fractions, acc = [], 0.0
    for v in split:
        acc += v
        fractions.append(acc / total)
    devs = [Device()]
    for j in range(len(split)):
        remote = j < len(opts.rpc)
        devs.append(Device(remote=remote, position=j if remote else j - len(opts.rpc)))
    return devs, fractions


def _place_layers(m: GGUFModel, opts: LlamaCppOptions, devs: list[Device], f: list[float], swa: bool):
    n_off, out_off = m.n_layer, True
    if opts.gpu_layers == 0:
        n_off, out_off = 0, False
    elif opts.gpu_layers > 0:
        n_off, out_off = min(opts.gpu_layers, m.n_layer), opts.gpu_layers > m.n_layer
    n_actual = n_off + (1 if out_off else 0)
    n_load = m.n_layer - n_off
    full = n_load == 0 and out_off
    out_dev = 0
    for i in range(m.n_layer):
        if i < n_load:
            d = devs[0]
        else:
            idx = min(bisect.bisect_right(f, (i - n_load) / n_actual) + 1, len(devs) - 1)
            d = devs[idx]
            if full and i == m.n_layer - 1:
                out_dev = idx  # by position: devs.index(d) compares fields, and a fresh GPU equals the CPU
        d.handle_layers += 1
        d.handle_last_layer = i
        if swa and (m.swa_pattern == 0 or i % m.swa_pattern != 0):
            d.handle_swa_layers += 1
    devs[out_dev].handle_output_layer = True
    return n_off, n_load, n_actual, full, out_dev


def estimate(m: GGUFModel, opts: LlamaCppOptions) -> Run:
    """One llama.cpp run of ``m`` with ``opts``: every device's footprint, weights, KV and compute."""
    devs, f = _devices(opts)
    swa = m.swa_pattern != 1 and not opts.swa_full
    n_off, n_load, n_actual, full, out_dev = _place_layers(m, opts, devs, f, swa)
    zero = n_off == 0
    fa = opts.flash_attention and m.architecture != "grok"
    ctk, ctv = opts.cache_type_k, opts.cache_type_v
    if ctv in T.QUANTIZED_CACHE_TYPES and not fa:
        ctv = "f16"
    ctx, ubatch, batch = opts.ctx_size, opts.ubatch_size, max(32, opts.batch_size)
    run = Run(devices=devs, offload_layers=n_off, full_offloaded=full)
    if not m.causal:
        run.embedding_only = True
        ctx = min(m.n_ctx_train, ctx or m.n_ctx_train)
        batch = ubatch = ctx
    if ubatch > batch:
        raise InvalidInput(f"ubatch-size {ubatch} must not exceed batch-size {batch}")
    align = 256 if fa else 32
    n_ctx = ctx if ctx is not None else m.n_ctx_train
    if opts.in_max_ctx_size:
        n_ctx = min(n_ctx, m.n_ctx_train)
    n_ctx = pad(n_ctx, align)
    n_tokens = n_batch = n_outputs = min(n_ctx, ubatch)
    n_kv, n_seq = n_ctx, opts.parallel_size
    run.context_size = n_ctx
    cpu = devs[0]

    # Footprint.
    cpu.footprint = 5 * MiB + (m.size - m.model_size) + m.tokens * 8
    if m.tokenizer_model == "gpt2":
        cpu.footprint += m.merges * (48 + 56)
    cpu.footprint += m.tokens * (32 + 24 + 32)
    ob = 4 * n_outputs * (m.n_embd + (m.n_vocab if m.causal else 0))
    devs[out_dev if full else 0].footprint += ob

    # Weights: the last n_off compute items go to the GPUs, the rest stay on the CPU.
    items = m.layer_bytes
    start = len(items) - n_off
    for i, b in enumerate(items):
        idx = 0 if i < start else min(bisect.bisect_right(f, (i - start) / n_actual) + 1, len(devs) - 1)
        devs[idx].w_compute += b
    cpu.w_input = m.input_bytes
    cpu.w_output = m.output_bytes
    if full:
        devs[out_dev].w_output = m.output_bytes

    # KV cache.
    if m.causal:
        k_gqa, v_gqa = m.head_k * m.n_head_kv, m.head_v * m.n_head_kv
        krs, vrs = T.cache_row_size(ctk, [k_gqa * n_kv]), T.cache_row_size(ctv, [v_gqa * n_kv])
        if swa:
            swas = min(n_kv, pad(m.swa * n_seq + batch, align))
            skrs, svrs = T.cache_row_size(ctk, [k_gqa * swas]), T.cache_row_size(ctv, [v_gqa * swas])
        else:
            skrs, svrs = krs, vrs

        def kv_of(layers: int, swa_layers: int) -> int:
            return (skrs + svrs) * swa_layers + (krs + vrs) * (layers - swa_layers)

        cpu.kv = kv_of(cpu.handle_layers, cpu.handle_swa_layers)
        if not opts.offload_kv:
            cpu.kv += sum(kv_of(d.handle_layers, d.handle_swa_layers) for d in devs[1:])
        elif not zero:
            for d in devs[1:]:
                d.kv = kv_of(d.handle_layers, d.handle_swa_layers)

    _computation(m, opts, run, n_tokens, n_batch, n_outputs, n_kv, n_load, zero, full, fa, ctk, ctv, out_dev)
    return run


def _computation(m, opts, run, n_tokens, n_batch, n_outputs, n_kv, n_load, zero, full, fa, ctk, ctv, out_dev):
    devs, cpu = run.devices, run.devices[0]
    nodes = max(1024, 8 * m.n_tensors)
    cpu.c_footprint = _TENSOR_OVERHEAD * nodes + _graph_overhead(nodes) + 4 * MiB
    cpu.c_footprint += 2 * _TENSOR_OVERHEAD * (m.n_tensors + 1 + m.n_layer * 3)
    inp_embd = 4 * m.n_embd * n_batch
    inp_pos, inp_kq = 4 * n_batch, 4 * n_kv * n_batch
    cpu.c_input = 4 * n_batch + inp_embd + inp_pos + inp_kq + 4 * n_outputs
    v = inp_embd + inp_pos + inp_kq
    if not opts.rpc and len(devs) > 2:
        v *= 2 if m.n_expert > 0 else 4
    for d in devs[1:]:
        d.c_input += v

    load_attn = T.cache_row_size(ctk, [m.head_k, n_kv, m.n_head_kv]) + T.cache_row_size(ctv, [m.head_v, n_kv, m.n_head_kv])
    off_attn = 0
    last = m.last_layer
    if fa:
        off_attn = 2 * n_kv * n_tokens
        for t in last:
            if t.name.endswith(".attn_norm.weight"):
                off_attn += 4 * t.dims[-1] * n_tokens
            elif t.name.endswith((".attn_q.weight", ".attn_qkv.weight", ".attn_q_b.weight")):
                off_attn += t.nbytes
        off_attn += load_attn
    else:
        kq = 4 * n_kv * n_tokens * m.n_head
        partial = not zero and not full
        for t in last:
            if t.name.endswith(".attn_norm.weight"):
                off_attn += 4 * t.dims[-1] * n_tokens
            elif t.name.endswith(".attn_q.weight"):
                off_attn += 2 * 4 * t.dims[0] * n_tokens + kq + (load_attn if partial else 0)
            elif t.name.endswith(".attn_qkv.weight"):
                off_attn += 2 * 4 * t.dims[0] * n_tokens + kq + 4 * m.n_embd * 3 * m.n_embd
                off_attn += load_attn if partial else 0
            elif t.name.endswith(".attn_q_b.weight"):
                off_attn += 2 * 4 * t.dims[-1] * n_tokens + kq
    ffn = sum(4 * t.dims[-1] * n_tokens for t in last
              if t.name.endswith((".attn_norm.weight", ".ffn_norm.weight", ".ffn_gate.weight", ".ffn_up.weight")))
    if m.n_expert > 0 or m.n_expert_used > 0:
        ffn += 4 * m.n_expert * m.n_embd + 4 * m.n_expert * n_tokens + 4 * m.n_embd * m.n_expert_used * n_tokens
    cpu.c_compute = load_attn if zero else load_attn + ffn
    for d in devs[1:]:
        d.c_compute = max(off_attn, ffn)
    if n_load > 1:
        for d in devs[1:]:
            if not d.remote:
                d.c_compute += load_attn
                break
    if m.causal:
        out = 4 * n_tokens * ((m.output_norm_dim or 0) + (m.output_dim or 0))
        devs[out_dev].c_output += out


def summarize(run: Run, opts: LlamaCppOptions) -> EstimateItem:
    """RAM and per-device VRAM, unified-memory (UMA) and discrete (NonUMA), as gguf-parser sums them."""
    cpu = run.devices[0]
    ram_uma = cpu.footprint + cpu.weight + cpu.kv + cpu.computation
    if opts.mmap or run.full_offloaded:
        ram_uma -= cpu.weight
        if not opts.mmap:
            ram_uma += cpu.w_output
    ram = Memory(cpu.handle_layers, cpu.handle_last_layer, cpu.handle_output_layer,
                 ram_uma, opts.platform_ram + ram_uma)
    vrams = []
    for d in run.devices[1:]:
        uma = d.footprint + d.weight + d.kv
        if opts.mmap and not (d.remote or (d.position > 0 and d.handle_last_layer >= 0)):
            uma -= d.weight
        nonuma = opts.platform_vram + d.footprint + d.weight + d.kv + d.computation
        if not d.remote and d.position > 0 and d.handle_last_layer < 0:
            nonuma -= d.weight + d.computation
        vrams.append(Memory(d.handle_layers, d.handle_last_layer, d.handle_output_layer,
                            uma, nonuma, d.remote, d.position))
    return EstimateItem(run.offload_layers + (1 if run.full_offloaded else 0), run.full_offloaded,
                        ram, tuple(vrams))


def estimate_item(m: GGUFModel, opts: LlamaCppOptions) -> EstimateItem:
    return summarize(estimate(m, opts), opts)


def estimate_items(m: GGUFModel, opts: LlamaCppOptions, step: int = 0) -> list[EstimateItem]:
    """gguf-parser's ``--gpu-layers-step``: items for 0, step, 2*step, ... layers, then the default run."""
    main = estimate_item(m, opts)
    n = estimate(m, opts).offload_layers
    if step <= 0 or step >= n:
        return [main]
    count = n // step + 1 + (1 if n % step or main.full_offloaded else 0)
    items = [estimate_item(m, replace(opts, gpu_layers=i * step)) for i in range(count - 1)]
    return items + [main]
