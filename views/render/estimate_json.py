"""``gpuflow estimate`` output: shaped like gguf-parser's ``estimate`` JSON for GGUF files, so
the two tools can be compared; a summary of claims for Hugging Face directories."""

from __future__ import annotations

from scheduler.gguf.estimate import LlamaCppOptions, estimate, estimate_items
from scheduler.gguf.model import load_model
from scheduler.gguf.reader import read_header
from scheduler.hf import claims
from scheduler.hf.config import load_parameters
from scheduler.hf.safetensors_header import directory_weight_bytes
from scheduler.units import gib


def _mem(m, device: bool) -> dict:
    d = {"handleLayers": m.handle_layers, "handleLastLayer": m.handle_last_layer,
         "handleOutputLayer": m.handle_output_layer}
    if device:
        d.update(remote=m.remote, position=m.position)
    d.update(uma=m.uma, nonuma=m.nonuma)
    return d


def gguf_json(path: str, opts: dict, step: int = 0) -> dict:
    m = load_model(read_header(path))
    o = LlamaCppOptions(**opts)
    items = estimate_items(m, o, step)
    run = estimate(m, o)
    return {
        "architecture": {"type": m.type, "architecture": m.architecture, "contextLength": m.n_ctx_train,
                         "embeddingLength": m.n_embd, "blockCount": m.n_layer, "attentionHeadCount": m.n_head,
                         "attentionHeadCountKV": m.n_head_kv, "vocabularyLength": m.n_vocab},
        "estimate": {
            "items": [{"offloadLayers": it.offload_layers, "fullOffloaded": it.full_offloaded,
                       "ram": _mem(it.ram, False), "vrams": [_mem(v, True) for v in it.vrams]} for it in items],
            "type": m.type, "architecture": m.architecture, "contextSize": run.context_size,
            "flashAttention": o.flash_attention and m.architecture != "grok", "noMMap": not o.mmap,
            "embeddingOnly": run.embedding_only, "reranking": m.reranking, "distributable": True,
            "logicalBatchSize": max(32, o.batch_size), "physicalBatchSize": o.ubatch_size,
        },
    }


def table(out: dict) -> str:
    e = out["estimate"]
    lines = [f"{e['architecture']} ({out['architecture']['blockCount']} layers), context {e['contextSize']}, "
             f"mmap {'off' if e['noMMap'] else 'on'}",
             "layers  full   RAM UMA / NonUMA (GiB)   VRAM per device UMA / NonUMA (GiB)"]
    for it in e["items"]:
        vr = "  ".join(f"[{v['handleLayers']}] {gib(v['uma'])}/{gib(v['nonuma'])}" for v in it["vrams"])
        lines.append(f"{it['offloadLayers']:>6}  {'yes' if it['fullOffloaded'] else 'no ':<5}  "
                     f"{gib(it['ram']['uma']):>8} / {gib(it['ram']['nonuma']):<10}  {vr}")
    return "\n".join(lines)


def hf_json(path: str) -> dict:
    p = load_parameters(path)
    weights, files = directory_weight_bytes(path)
    return {"architectures": list(p.architectures), "config_source": p.source, "layers": p.num_layers,
            "attention_heads": p.num_attention_heads, "kv_heads": p.num_kv_heads, "head_dim": p.head_dim,
            "vocab_size": p.vocab_size, "max_model_len": p.max_model_len, "weight_bytes": weights,
            "weight_files": len(files), "kv_cache_bytes_per_token": claims.kv_bytes_per_token(p),
            "gpustack_vram_claim": claims.vram_claim(weights, [])}
