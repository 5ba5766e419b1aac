"""What a Hugging Face model asks of a GPU: GPUStack's claims, KV bytes per token, TP rules.

GPUStack does not model the KV cache for vLLM/SGLang: it claims ``weights * 1.2 + 2 GiB`` and
lets the engine's whole-card fraction (vLLM ``--gpu-memory-utilization`` 0.9, SGLang
``--mem-fraction-static`` from its table) hold the cache. We keep those claims as the decision
rule, and report the KV cache per token beside them so people can see what a context costs.
"""

from __future__ import annotations

from scheduler.hf.config import ModelParameters
from scheduler.units import GiB, MiB

LLM, TTS = "llm", "text_to_speech"
VLLM_DEFAULT_GMU = 0.9
_GMU_EXCEPTIONS = {"Qwen3ForCausalLM", "Qwen3ForSequenceClassification",
                   "Qwen3VLForConditionalGeneration", "Qwen3VLForSequenceClassification"}


def is_llm(categories: list[str]) -> bool:
    return not categories or LLM in categories


def claim_terms(categories: list[str]) -> tuple[float, int]:
    """(factor, overhead bytes): 3 for text-to-speech, else 1.2; 2 GiB for LLMs, else 512 MiB."""
    return (3 if TTS in categories else 1.2), (2 * GiB if is_llm(categories) else 512 * MiB)


def vram_claim(weight_bytes: int, categories: list[str], lora_bytes: int = 0) -> int:
    """GPUStack's ``estimate_model_vram``: int((W + LoRA) * factor) + overhead."""
    factor, overhead = claim_terms(categories)
    return int((weight_bytes + lora_bytes) * factor) + overhead


def custom_ram_claim(vram: int) -> int:
    """GPUStack's RAM claim for custom engines: a tenth of the VRAM claim, at least 2 GiB."""
    return max(int(0.1 * vram), 2 * GiB)


def kv_bytes_per_token(p: ModelParameters, tp: int = 1, kv_dtype_bytes: int | None = None) -> int:
    """KV cache bytes per token on one GPU (vLLM's page size / block size).

    2 * layers * max(1, kv_heads // tp) * head_dim * bytes; MLA keeps one latent head of
    kv_lora_rank + qk_rope_head_dim, not split by TP. fp32 checkpoints cache in 16 bits.
    """
    b = kv_dtype_bytes or min(p.dtype_bytes, 2)
    if p.kv_lora_rank and p.qk_rope_head_dim is not None:
        return p.num_layers * (p.kv_lora_rank + p.qk_rope_head_dim) * b
    return 2 * p.num_layers * max(1, p.num_kv_heads // tp) * p.head_dim * b


def tp_problems(p: ModelParameters, n: int, check_vision: bool = True) -> list[str]:
    """Why ``n`` GPUs cannot be a tensor-parallel size for this model (empty list: it can)."""
    out = []
    if p.num_attention_heads and p.num_attention_heads % n:
        out.append(f"Total number of attention heads ({p.num_attention_heads}) must be divisible by tensor parallel size ({n}).")
    if check_vision and p.vision_num_attention_heads and p.vision_num_attention_heads % n:
        out.append(f"Total number of vision attention heads ({p.vision_num_attention_heads}) must be divisible by tensor parallel size ({n}).")
    if p.vocab_size and p.vocab_size % n:
        out.append(f"Vocabulary size ({p.vocab_size}) must be divisible by tensor parallel size ({n}).")
    return out


def vllm_gmu(categories: list[str], architectures: tuple[str, ...], explicit: float | None) -> float:
    """vLLM's GPU memory utilisation as GPUStack budgets it: 0.9; 0 (claim the estimate only) for
    non-LLM categories unless the architecture is a Qwen3 exception; an explicit flag wins."""
    if explicit is not None:
        return explicit
    if categories and LLM not in categories and "speech_to_text" not in categories \
            and not set(architectures) & _GMU_EXCEPTIONS:
        return 0.0
    return VLLM_DEFAULT_GMU
