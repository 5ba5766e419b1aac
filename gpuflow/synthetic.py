"""Real model files with a real layout but no weights: GGUF written with ``gguf.GGUFWriter``
(header and tensor infos, then the file truncated to its full size, so it is sparse) and Hugging
Face directories (config.json plus safetensors headers over sparse data). The estimator reads
them exactly as it reads downloaded models; the demo, tests and benchmarks use them."""

from __future__ import annotations

import json
import os
import struct

import numpy as np

from scheduler.gguf.types import BY_NAME, GGML_TYPES

LLAMA3_8B = dict(n_layer=32, n_embd=4096, n_ff=14336, n_head=32, n_head_kv=8, n_vocab=128256, ctx=8192,
                 merges=280147, name="Meta-Llama-3-8B-Instruct")


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _types(recipe: str, n_layer: int):
    """llama.cpp's quantization recipe: (default type, output type, f(layer, tensor) -> type)."""
    if recipe in ("F16", "Q8_0", "Q4_0", "Q4_1"):
        t = recipe.lower()
        return t, ("q6_k" if recipe.startswith("Q4") else t), lambda i, n: t
    base = {"Q5_K_M": "q5_k", "Q4_K_M": "q4_k"}[recipe]

    def per(i: int, name: str) -> str:
        if name in ("attn_v", "ffn_down") and _use_more_bits(i, n_layer):
            return "q6_k"
        return base
    return base, "q6_k", per


def write_llama_gguf(path: str, *, n_layer: int, n_embd: int, n_ff: int, n_head: int, n_head_kv: int,
                     n_vocab: int, ctx: int, merges: int = 0, recipe: str = "Q5_K_M", name: str = "synthetic",
                     arch: str = "llama", tied: bool = False, sliding_window: int | None = None,
                     header: dict[str, int | None] | None = None) -> str:
    """A llama-architecture GGUF with the given shape and quantization, sparse on disk.
    ``header`` overrides metadata keys after the fact (None drops the key), for files whose
    header does not match their tensors."""
    from gguf import GGUFWriter, GGMLQuantizationType

    default, out_t, per = _types(recipe, n_layer)
    w = GGUFWriter(path, arch)
    w.add_type("model")
    w.add_name(name)
    w.add_context_length(ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    if sliding_window:
        w.add_sliding_window(sliding_window)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(n_vocab)])
    if merges:
        w.add_token_merges([f"a b{i}" for i in range(merges)])
    for key, value in (header or {}).items():
        for kvs in w.kv_data:
            kvs.pop(key, None)
        if value is not None:
            (w.add_uint64 if value >= 2**32 else w.add_uint32)(key, value)
    kv = n_embd // n_head * n_head_kv
    tensors = [("token_embd.weight", [n_embd, n_vocab], default)]
    for i in range(n_layer):
        p = f"blk.{i}."
        tensors += [(p + "attn_norm.weight", [n_embd], "f32"),
                    (p + "attn_q.weight", [n_embd, n_embd], per(i, "attn_q")),
                    (p + "attn_k.weight", [n_embd, kv], per(i, "attn_k")),
                    (p + "attn_v.weight", [n_embd, kv], per(i, "attn_v")),
                    (p + "attn_output.weight", [n_embd, n_embd], per(i, "attn_output")),
                    (p + "ffn_norm.weight", [n_embd], "f32"),
                    (p + "ffn_gate.weight", [n_embd, n_ff], per(i, "ffn_gate")),
                    (p + "ffn_up.weight", [n_embd, n_ff], per(i, "ffn_up")),
                    (p + "ffn_down.weight", [n_ff, n_embd], per(i, "ffn_down"))]
    tensors.append(("output_norm.weight", [n_embd], "f32"))
    if not tied:
        tensors.append(("output.weight", [n_embd, n_vocab], out_t))
    total = 0
    for tname, dims, t in tensors:
        tid = BY_NAME[t]
        _, block, size = GGML_TYPES[tid]
        nbytes = size * dims[0] // block
        for d in dims[1:]:
            nbytes *= d
        w.add_tensor_info(tname, list(reversed(dims)), np.dtype(np.float32), nbytes, raw_dtype=GGMLQuantizationType(tid))
        total += nbytes + (-nbytes % 32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    start = os.path.getsize(path)
    start += -start % 32
    os.truncate(path, start + total)
    return path


def write_hf_model(model_dir: str, config: dict, tensors: dict[str, tuple[str, list[int]]], shards: int = 1) -> str:
    """A Hugging Face directory: config.json and safetensors shards whose data is sparse."""
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(config, f)
    sizes = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "I8": 1, "U8": 1, "F8_E4M3": 1}
    names = list(tensors)
    per = -(-len(names) // shards)
    weight_map, total = {}, 0
    for s in range(shards):
        part = names[s * per:(s + 1) * per]
        fname = "model.safetensors" if shards == 1 else f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        header, off = {}, 0
        for n in part:
            dtype, shape = tensors[n]
            nbytes = sizes[dtype] * int(np.prod(shape))
            header[n] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + nbytes]}
            off += nbytes
            weight_map[n] = fname
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        p = os.path.join(model_dir, fname)
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
        os.truncate(p, 8 + len(raw) + off)
        total += off
    if shards > 1:
        with open(os.path.join(model_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    return model_dir


def llama_like_hf(model_dir: str, *, layers: int, hidden: int, ff: int, heads: int, kv_heads: int, vocab: int,
                  max_pos: int, arch: str = "LlamaForCausalLM", model_type: str = "llama", tied: bool = False,
                  shards: int = 1, bias: bool = False) -> str:
    """A llama/qwen2-shaped bf16 checkpoint (config and sparse safetensors)."""
    head_dim = hidden // heads
    kv = head_dim * kv_heads
    t: dict[str, tuple[str, list[int]]] = {"model.embed_tokens.weight": ("BF16", [vocab, hidden])}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = ("BF16", [hidden, hidden])
        t[p + "self_attn.k_proj.weight"] = ("BF16", [kv, hidden])
        t[p + "self_attn.v_proj.weight"] = ("BF16", [kv, hidden])
        if bias:
            t[p + "self_attn.q_proj.bias"] = ("BF16", [hidden])
            t[p + "self_attn.k_proj.bias"] = ("BF16", [kv])
            t[p + "self_attn.v_proj.bias"] = ("BF16", [kv])
        t[p + "self_attn.o_proj.weight"] = ("BF16", [hidden, hidden])
        t[p + "mlp.gate_proj.weight"] = ("BF16", [ff, hidden])
        t[p + "mlp.up_proj.weight"] = ("BF16", [ff, hidden])
        t[p + "mlp.down_proj.weight"] = ("BF16", [hidden, ff])
        t[p + "input_layernorm.weight"] = ("BF16", [hidden])
        t[p + "post_attention_layernorm.weight"] = ("BF16", [hidden])
    t["model.norm.weight"] = ("BF16", [hidden])
    if not tied:
        t["lm_head.weight"] = ("BF16", [vocab, hidden])
    config = {"architectures": [arch], "model_type": model_type, "hidden_size": hidden, "intermediate_size": ff,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads, "num_hidden_layers": layers,
              "vocab_size": vocab, "max_position_embeddings": max_pos, "torch_dtype": "bfloat16",
              "tie_word_embeddings": tied}
    return write_hf_model(model_dir, config, t, shards)
