"""A GGUF header's numbers checked against the tensors actually in the file and against
physical reason, before anything loops over them.

The header is untrusted: a ``block_count`` of 2^32-1 over a file with two layers once had the
estimator loop for minutes per estimate (its work grows with the square of the layer count), and
zero heads, zero vocabulary, zero context or zero layers were taken as they came. llama.cpp
refuses such files at load time ("wrong number of tensors", a missing blk.N tensor, a zero
hparam), so refusing them here loses no model that could run. Every message names the key.

The ceilings are well above any published model (the largest have ~160 layers, 128 heads,
a 16k embedding, a 256k vocabulary, a 10M-token context)."""

from __future__ import annotations

from scheduler.errors import ModelFileError

MAX_LAYERS = 1024
MAX_HEADS = 1 << 16
MAX_EMBD = 1 << 20
MAX_VOCAB = 1 << 24
MAX_CTX = 1 << 27
MAX_EXPERTS = 1 << 16


def _range(path: str, key: str, v: int, lo: int, hi: int) -> None:
    if not lo <= v <= hi:
        raise ModelFileError(path, f"{key} is {v}: must be {lo}..{hi}" + (" (missing?)" if v == 0 and lo > 0 else ""))


def check(path: str, arch: str, m, blocks: list[int], token_embd_dims: tuple[int, ...] | None) -> None:
    """Refuse what no model can be: ``m`` is the GGUFModel folded from the header, ``blocks`` the
    distinct N of the blk.N tensors present, ``token_embd_dims`` the embedding's shape."""
    x = arch
    _range(path, f"{x}.block_count", m.n_layer, 1, MAX_LAYERS)
    present = len(blocks)
    if m.n_layer != present or (blocks and max(blocks) != present - 1):
        raise ModelFileError(path, f"{x}.block_count is {m.n_layer} but the file holds {present} layers "
                                   f"(blk.N tensors for N in {sorted(blocks)[:3]}...{sorted(blocks)[-1:]})"
                             if present else f"{x}.block_count is {m.n_layer} but the file has no blk.N tensors")
    _range(path, f"{x}.embedding_length", m.n_embd, 1, MAX_EMBD)
    _range(path, f"{x}.attention.head_count", m.n_head, 1, MAX_HEADS)
    _range(path, f"{x}.attention.head_count_kv", m.n_head_kv, 1, m.n_head)
    _range(path, f"{x}.attention.key_length", m.head_k, 1, MAX_EMBD)
    _range(path, f"{x}.attention.value_length", m.head_v, 1, MAX_EMBD)
    _range(path, f"{x}.context_length", m.n_ctx_train, 1, MAX_CTX)
    _range(path, f"{x}.vocab_size (or the tokenizer.ggml.tokens count)", m.n_vocab, 1, MAX_VOCAB)
    _range(path, f"{x}.expert_count", m.n_expert, 0, MAX_EXPERTS)
    _range(path, f"{x}.expert_used_count", m.n_expert_used, 0, m.n_expert)
    _range(path, f"{x}.attention.sliding_window", m.swa, 0, MAX_CTX)
    if token_embd_dims is not None:
        if token_embd_dims[0] != m.n_embd:
            raise ModelFileError(path, f"{x}.embedding_length is {m.n_embd} but token_embd.weight is "
                                       f"{token_embd_dims[0]} wide")
        if len(token_embd_dims) > 1 and token_embd_dims[1] != m.n_vocab:
            raise ModelFileError(path, f"the vocabulary has {m.n_vocab} entries ({x}.vocab_size or "
                                       f"tokenizer.ggml.tokens) but token_embd.weight has {token_embd_dims[1]} rows")
