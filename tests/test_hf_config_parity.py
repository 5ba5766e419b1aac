"""A local config.json read with the standard library gives the same model parameters as
transformers' AutoConfig (issue 26, point 9: importing transformers cost 1-2 s of a dry run).
Each model type read without transformers (scheduler/hf/config.py PLAIN) is read both ways here,
with a config as its models ship it; the cases where the file alone cannot answer go through
AutoConfig, and the table shows what reading the file alone would have got wrong."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuflow.demo.synthetic import write_hf_model
from scheduler.hf.config import PLAIN, file_alone_answers, load_parameters

LLAMA3 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
          "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256, "max_position_embeddings": 8192,
          "intermediate_size": 14336, "torch_dtype": "bfloat16", "rope_theta": 500000.0}
SHIPPED = {  # one config per type, the keys as its models' config.json have them
    "llama": LLAMA3,
    "mistral": {**LLAMA3, "architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 32768,
                "max_position_embeddings": 32768, "head_dim": 128},
    "qwen2": {**LLAMA3, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
              "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 152064,
              "max_position_embeddings": 32768},
    "phi3": {**LLAMA3, "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072,
             "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064, "max_position_embeddings": 4096},
    "starcoder2": {**LLAMA3, "architectures": ["Starcoder2ForCausalLM"], "model_type": "starcoder2", "hidden_size": 3072,
                   "num_attention_heads": 24, "num_key_value_heads": 2, "num_hidden_layers": 30, "vocab_size": 49152,
                   "max_position_embeddings": 16384},
    "qwen3": {**LLAMA3, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 2560,
              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 36,
              "vocab_size": 151936, "max_position_embeddings": 40960},
    "gemma": {**LLAMA3, "architectures": ["GemmaForCausalLM"], "model_type": "gemma", "hidden_size": 3072,
              "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256, "num_hidden_layers": 28,
              "vocab_size": 256000},
    "gemma2": {**LLAMA3, "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 2304,
               "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "num_hidden_layers": 26,
               "vocab_size": 256000},
    "mixtral": {**LLAMA3, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 32000,
                "max_position_embeddings": 32768, "num_local_experts": 8, "num_experts_per_tok": 2},
    "qwen2_moe": {**LLAMA3, "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 2048,
                  "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 24, "vocab_size": 151936,
                  "num_experts": 60},
    "qwen3_moe": {**LLAMA3, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
                  "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_hidden_layers": 48,
                  "vocab_size": 151936, "max_position_embeddings": 40960, "num_experts": 128},
}


def both(tmp_path, config: dict):
    d = write_hf_model(str(tmp_path / "m"), config, {"w": ("BF16", [8])})
    return load_parameters(d), load_parameters(d, transformers=True)


def test_every_plain_type_has_a_shipped_config():
    assert sorted(SHIPPED) == sorted(PLAIN)


@pytest.mark.parametrize("model_type", sorted(SHIPPED))
def test_the_file_alone_reads_as_transformers_does(tmp_path, model_type):
    fast, auto = both(tmp_path, SHIPPED[model_type])
    assert (fast.source, auto.source) == ("config.json", "autoconfig")
    assert replace(fast, source="") == replace(auto, source="")


@pytest.mark.parametrize("model_type, drop", [
    # llama, qwen2, mixtral without head_dim: their classes compute hidden / heads, as the file-alone read does
    ("llama", "head_dim"), ("qwen2", "head_dim"), ("mixtral", "head_dim"),
    # no torch_dtype: both read 2 bytes (bfloat16)
    ("llama", "torch_dtype"),
])
def test_keys_whose_default_is_ours_may_be_absent(tmp_path, model_type, drop):
    config = {k: v for k, v in SHIPPED[model_type].items() if k != drop}
    assert file_alone_answers(config)
    fast, auto = both(tmp_path, config)
    assert replace(fast, source="") == replace(auto, source="")


@pytest.mark.parametrize("config, field, from_transformers, from_file", [
    # Mistral's class defaults num_key_value_heads to 8, not to the 32 heads
    ({**SHIPPED["mistral"], "num_key_value_heads": None}, "num_kv_heads", 8, 32),
    # Qwen3's class defaults head_dim to 128; 2560 / 32 = 80
    ({**SHIPPED["qwen3"], "head_dim": None}, "head_dim", 128, 80),
    # Gemma: 256, not 3072 / 16 = 192
    ({**SHIPPED["gemma"], "head_dim": None}, "head_dim", 256, 192),
    # Mixtral's class: 8 experts
    ({**SHIPPED["mixtral"], "num_local_experts": None}, "num_experts", 8, 0),
    # Llama's class: 2048 positions (the file alone would say no limit, 0)
    ({**SHIPPED["llama"], "max_position_embeddings": None}, "max_model_len", 2048, 0),
])
def test_where_the_file_alone_cannot_answer_transformers_does(tmp_path, config, field, from_transformers, from_file):
    config = {k: v for k, v in config.items() if v is not None}
    assert not file_alone_answers(config)
    p = load_parameters(write_hf_model(str(tmp_path / "m"), config, {"w": ("BF16", [8])}))
    assert (p.source, getattr(p, field)) == ("autoconfig", from_transformers)
    assert from_file != from_transformers  # what reading the file alone would have booked


@pytest.mark.parametrize("config", [
    {**LLAMA3, "text_config": {"hidden_size": 64}},  # nested: sub-config classes fill in theirs
    {**LLAMA3, "vision_config": {"num_attention_heads": 16}},
    {**LLAMA3, "auto_map": {"AutoConfig": "x.C"}},  # remote code
    {**LLAMA3, "model_type": "deepseek_v3"},  # a type not in PLAIN
    {**LLAMA3, "num_hidden_layers": 32.0},  # not an integer
    {**LLAMA3, "vocab_size": True},
])
def test_other_configs_go_to_transformers(config):
    assert not file_alone_answers(config)
