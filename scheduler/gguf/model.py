"""From a GGUF header to the few numbers llama.cpp's memory model needs, computed once.

The estimator runs many times per decision (one item per offloaded-layer count, one run per
tensor split), so everything that depends only on the file is folded here: architecture keys
with their defaults, tokenizer sizes, input/output weight bytes and per-layer weight bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from scheduler.errors import ModelFileError
from scheduler.gguf import sanity
from scheduler.gguf.reader import ArrayInfo, GGUFHeader, TensorInfo

_INPUT_PREFIXES = ("position_", "token_")
_IO_PREFIXES = ("position_", "token_", "cls.", "output.", "output_", "rope_factors_")
_BLOCK = re.compile(r"^blk\.(\d+)\.")
_RECURRENT = {"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7", "jamba", "falcon-h1",
              "granitehybrid"}
# arch -> (default sliding window, pattern); pattern 1 means no SWA
_SWA = {"llama4": (8192, 4), "gemma2": (4096, 2), "gemma3": (None, 6), "cohere2": (None, 4)}


@dataclass
class GGUFModel:
    path: str
    architecture: str
    type: str
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_k: int
    head_v: int
    causal: bool
    n_vocab: int
    n_expert: int
    n_expert_used: int
    swa: int
    swa_pattern: int
    tokens: int
    merges: int
    tokenizer_model: str
    n_tensors: int
    size: int
    model_size: int
    input_bytes: int
    output_bytes: int  # output.* / output_* tensors (+ input bytes when embeddings are tied)
    has_output_weight: bool
    layer_bytes: list[int] = field(default_factory=list)  # compute items in file order
    last_layer: list[TensorInfo] = field(default_factory=list)
    output_norm_dim: int | None = None
    output_dim: int | None = None  # last dim of output.weight, else of token_embd.weight
    file_type: int | None = None
    name: str | None = None
    pooling_type: int = 0

    @property
    def reranking(self) -> bool:
        return not self.causal and self.pooling_type == 4


def _first(v):
    if isinstance(v, ArrayInfo):
        return v.values[0] if v.values else 0
    return v


def _int(h: GGUFHeader, key: str, default: int = 0) -> int:
    v = _first(h.get(key, default))
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ModelFileError(h.path, f"metadata {key} is {v!r}, expected a number")
    return int(v)


def _length(h: GGUFHeader, key: str) -> int:
    v = h.get(key)
    return v.count if isinstance(v, ArrayInfo) else 0


def _group(tensors: list[TensorInfo]) -> tuple[list[TensorInfo], list[TensorInfo], list[list[TensorInfo]]]:
    inputs, outputs, items, by_block = [], [], [], {}
    for t in tensors:
        if t.name.startswith(_IO_PREFIXES):
            (inputs if t.name.startswith(_INPUT_PREFIXES) else outputs).append(t)
            continue
        m = _BLOCK.match(t.name)
        if m is None:
            items.append([t])
        elif m[1] in by_block:
            by_block[m[1]].append(t)
        else:
            by_block[m[1]] = [t]
            items.append(by_block[m[1]])
    return inputs, outputs, items


def load_model(h: GGUFHeader) -> GGUFModel:
    """Fold a header into a GGUFModel; rejects what llama.cpp's model path cannot estimate."""
    arch = h.get("general.architecture", "llama")
    if not isinstance(arch, str):
        raise ModelFileError(h.path, f"general.architecture is {arch!r}, expected a string")
    gtype = h.get("general.type", "model")
    if gtype != "model":
        raise ModelFileError(h.path, f"general.type is {gtype!r}; only 'model' files can be scheduled")
    if arch in _RECURRENT:
        raise ModelFileError(h.path, f"architecture {arch!r} is recurrent; its memory model is not supported yet")
    if not h.tensors:
        raise ModelFileError(h.path, "the file has no tensors")
    x = arch
    n_embd = _int(h, f"{x}.embedding_length")
    n_head = _int(h, f"{x}.attention.head_count")
    n_head_kv = _int(h, f"{x}.attention.head_count_kv", n_head)
    head_k = _int(h, f"{x}.attention.key_length", n_embd // n_head if n_head else 0)
    head_v = _int(h, f"{x}.attention.value_length", n_embd // n_head if n_head else 0)
    k_mla = _int(h, f"{x}.attention.key_length_mla")
    v_mla = _int(h, f"{x}.attention.value_length_mla")
    if k_mla > 0 and v_mla > 0:
        head_k, head_v = k_mla, v_mla
    pooling = _int(h, f"{x}.pooling_type")
    causal = bool(h.get(f"{x}.attention.causal", True)) and pooling <= 2
    tokens = _length(h, "tokenizer.ggml.tokens")
    n_vocab = _int(h, f"{x}.vocab_size", tokens)
    swa_default, pattern = _SWA.get(arch, (0, 1))
    swa = _int(h, f"{x}.attention.sliding_window", swa_default or 0)
    if arch == "phi3":
        swa = 0
    if swa == 0:
        pattern = 1
    inputs, outputs, items = _group(h.tensors)
    n_layer = _int(h, f"{x}.block_count") or len(items)
    if _int(h, f"{x}.block_count", -1) == 0:
        raise ModelFileError(h.path, f"{x}.block_count is 0: a model has at least one layer")
    if not items:
        raise ModelFileError(h.path, "the file has no transformer layers (no blk.N tensors)")
    input_bytes = sum(t.nbytes for t in inputs)
    names = {t.name: t for t in h.tensors}
    has_output = "output.weight" in names
    output_bytes = sum(t.nbytes for t in outputs) + (0 if has_output else input_bytes)
    out_w = names.get("output.weight") or names.get("token_embd.weight")
    out_norm = names.get("output_norm.weight")
    if n_embd <= 0 or n_head <= 0 or n_layer <= 0:
        raise ModelFileError(
            h.path, f"{x}.embedding_length/attention.head_count/block_count must be > 0 "
            f"(got {n_embd}/{n_head}/{n_layer})")
    model = GGUFModel(
        path=h.path, architecture=arch, type=gtype,
        n_ctx_train=_int(h, f"{x}.context_length"), n_embd=n_embd, n_layer=n_layer,
        n_head=n_head, n_head_kv=n_head_kv or n_head, head_k=head_k, head_v=head_v,
        causal=causal, n_vocab=n_vocab, n_expert=_int(h, f"{x}.expert_count"),
        n_expert_used=_int(h, f"{x}.expert_used_count"), swa=swa, swa_pattern=pattern,
        tokens=tokens, merges=_length(h, "tokenizer.ggml.merges"),
        tokenizer_model=str(h.get("tokenizer.ggml.model", "")),
        n_tensors=len(h.tensors), size=h.size, model_size=h.model_size,
        input_bytes=input_bytes, output_bytes=output_bytes, has_output_weight=has_output,
        layer_bytes=[sum(t.nbytes for t in item) for item in items], last_layer=items[-1],
        output_norm_dim=out_norm.dims[-1] if out_norm else None,
        output_dim=out_w.dims[-1] if out_w else None,
        file_type=h.get("general.file_type"), name=h.get("general.name"), pooling_type=pooling,
    )
    blocks = sorted({int(m[1]) for t in h.tensors if (m := _BLOCK.match(t.name))})
    embd = names.get("token_embd.weight")
    sanity.check(h.path, x, model, blocks, embd.dims if embd else None)
    return model
