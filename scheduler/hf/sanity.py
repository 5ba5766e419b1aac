"""A Hugging Face ``config.json``'s numbers checked against physical reason before they are
costed: a key that is present must hold a count no model can do without (zero heads, zero
layers, zero vocabulary) or beyond any model (a billion layers) is refused, naming the key.
A key that is absent stays 0, as before (not every model has every key). Ceilings match the
GGUF checks (scheduler/gguf/sanity.py)."""

from __future__ import annotations

from scheduler.errors import ModelFileError
from scheduler.gguf.sanity import MAX_CTX, MAX_EMBD, MAX_EXPERTS, MAX_HEADS, MAX_LAYERS, MAX_VOCAB

# key -> (lowest, highest) for a value that is given
BOUNDS = {
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers"), (1, MAX_LAYERS)),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads"), (1, MAX_HEADS)),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "n_head_kv"), (1, MAX_HEADS)),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "head_dim"), (1, MAX_EMBD)),
    "vocab_size": (1, MAX_VOCAB),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                     "max_sequence_length", "max_seq_length", "seq_len"), (1, MAX_CTX)),
    **dict.fromkeys(("n_routed_experts", "num_local_experts", "num_experts"), (0, MAX_EXPERTS)),
    "kv_lora_rank": (1, MAX_EMBD),
    "qk_rope_head_dim": (1, MAX_EMBD),
}


def check(path: str, text: dict, where: str = "") -> None:
    """Refuse impossible values among ``text``'s keys (the language model's section)."""
    for key, (lo, hi) in BOUNDS.items():
        v = text.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if not lo <= v <= hi:
            raise ModelFileError(path, f"{where}{key} is {v!r}: must be {lo}..{hi}")
    heads, kv = text.get("num_attention_heads"), text.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv, int) and kv > heads:
        raise ModelFileError(path, f"{where}num_key_value_heads is {kv}, more than num_attention_heads ({heads})")
