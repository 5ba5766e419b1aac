"""Model hyper-parameters from a local Hugging Face directory's ``config.json``.

The values must be the ones the engines will see (transformers' computed ``head_dim`` and
defaults). Where the file alone says them, it is read with the standard library (importing
transformers costs 1-2 s of a dry run): a text-only model of a type in ``PLAIN`` whose file
states, as integers, every key read here that its transformers config class would otherwise
fill in with a default (``REQUIRED``, plus the type's own: Qwen3's and Gemma's ``head_dim``
defaults to 128/256 rather than hidden / heads; an MoE type's expert count). Everything else
goes through ``transformers.AutoConfig`` offline (``local_files_only``): another model type, a
key left to its default, nested configs (``text_config``, ``llm_config``, ``thinker_config``,
``vision_config``: sub-config classes fill theirs), ``auto_map`` (remote code). When
transformers does not know the architecture the raw JSON is read instead, as GPUStack falls
back. tests/test_hf_config_parity.py checks both readings agree for each type in ``PLAIN``.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field

from scheduler.errors import ModelFileError
from scheduler.hf import sanity

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "float8_e4m3fn": 1,
                "float8_e5m2": 1, "int8": 1, "uint8": 1}
_MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                 "max_sequence_length", "max_seq_length", "seq_len")


@dataclass(frozen=True)
class ModelParameters:
    architectures: tuple[str, ...] = ()
    model_type: str = ""
    num_layers: int = 0
    num_attention_heads: int = 0
    num_kv_heads: int = 0
    hidden_size: int = 0
    head_dim: int = 0
    vocab_size: int = 0
    max_model_len: int = 0
    dtype_bytes: int = 2
    vision_num_attention_heads: int | None = None
    kv_lora_rank: int | None = None  # MLA
    qk_rope_head_dim: int | None = None
    num_experts: int = 0
    source: str = "autoconfig"  # or "config.json": read from the file alone (it answered, or transformers did not know it)
    raw: dict = field(default_factory=dict, compare=False, repr=False)


def _raw(model_dir: str) -> dict:
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        raise ModelFileError(model_dir, "no config.json: not a Hugging Face model directory")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFileError(path, f"not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ModelFileError(path, "top level is not a JSON object")
    return cfg


REQUIRED = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "vocab_size",
            "max_position_embeddings")
# model_type -> the keys beyond REQUIRED its file must state (their class defaults differ from ours)
PLAIN: dict[str, tuple[str, ...]] = {
    "llama": (), "mistral": (), "qwen2": (), "phi3": (), "starcoder2": (),
    "qwen3": ("head_dim",), "gemma": ("head_dim",), "gemma2": ("head_dim",),
    "mixtral": ("num_local_experts",), "qwen2_moe": ("num_experts",), "qwen3_moe": ("head_dim", "num_experts"),
}
NESTED = ("text_config", "llm_config", "thinker_config", "vision_config", "auto_map")


def file_alone_answers(raw: dict) -> bool:
    """Whether transformers would add nothing to what this config.json states (see the module's doc)."""
    extra = PLAIN.get(raw.get("model_type"))  # type: ignore[arg-type]
    if extra is None or any(k in raw for k in NESTED):
        return False
    return all(isinstance(raw.get(k), int) and not isinstance(raw.get(k), bool) for k in REQUIRED + extra)


def _autoconfig(model_dir: str) -> dict | None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        from transformers import AutoConfig  # imported lazily: ~1 s

        return AutoConfig.from_pretrained(model_dir, local_files_only=True).to_dict()
    except Exception:  # unknown architecture, too-old transformers, remote code: fall back
        return None


def _text(cfg: dict) -> dict:
    for key in ("llm_config", "text_config"):
        if isinstance(cfg.get(key), dict):
            return cfg[key]
    thinker = cfg.get("thinker_config")
    if isinstance(thinker, dict) and isinstance(thinker.get("text_config"), dict):
        return thinker["text_config"]
    return cfg


def _num(cfg: dict, *keys: str, default=0):
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return int(v)
    return default


def load_parameters(model_dir: str, transformers: bool | None = None) -> ModelParameters:
    """``transformers``: None reads the file alone where it answers (``file_alone_answers``),
    else with AutoConfig; True always asks AutoConfig (the parity tests)."""
    raw = _raw(model_dir)
    auto = _autoconfig(model_dir) if transformers or not file_alone_answers(raw) else None
    cfg = auto or raw
    text = _text(cfg)
    raw_text = _text(raw)
    sanity.check(os.path.join(model_dir, "config.json"), raw_text, "" if raw_text is raw else "text_config.")
    if text is not raw_text:
        sanity.check(os.path.join(model_dir, "config.json"), text, "(as transformers reads it) ")
    heads = _num(text, "num_attention_heads", "n_head", "num_heads")
    hidden = _num(text, "hidden_size", "n_embd", "d_model")
    dtype = text.get("dtype") or text.get("torch_dtype") or cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
    vision = cfg.get("vision_config") if isinstance(cfg.get("vision_config"), dict) else None
    vheads = None
    if vision:
        vh = _num(vision, "num_attention_heads", "num_heads", default=None)
        if vh is not None:
            vheads = vh + max(_num(vision, "num_dummy_heads"), 0)
    max_len = min([v for v in (_num(text, k, default=None) for k in _MAX_LEN_KEYS) if v] or [0])
    return ModelParameters(
        architectures=tuple(raw.get("architectures") or cfg.get("architectures") or ()),
        model_type=str(cfg.get("model_type", "")),
        num_layers=_num(text, "num_hidden_layers", "n_layer", "num_layers"),
        num_attention_heads=heads,
        num_kv_heads=_num(text, "num_key_value_heads", "num_kv_heads", "n_head_kv", default=heads),
        hidden_size=hidden,
        head_dim=_num(text, "head_dim") or (hidden // heads if heads else 0),
        vocab_size=_num(text, "vocab_size") or _num(cfg, "vocab_size"),
        max_model_len=max_len,
        dtype_bytes=_DTYPE_BYTES.get(str(dtype).replace("torch.", ""), 2),
        vision_num_attention_heads=vheads,
        kv_lora_rank=_num(text, "kv_lora_rank", default=None),
        qk_rope_head_dim=_num(text, "qk_rope_head_dim", default=None),
        num_experts=_num(text, "n_routed_experts", "num_local_experts", "num_experts"),
        source="autoconfig" if auto else "config.json",
        raw=raw,
    )
