"""Hugging Face estimation: config, safetensors headers, KV per token, GPUStack's claims."""

import json
from dataclasses import replace

import pytest

from gpuflow.demo.synthetic import llama_like_hf, write_hf_model
from scheduler.errors import ModelFileError
from scheduler.hf import claims
from scheduler.hf.config import load_parameters
from scheduler.hf.safetensors_header import directory_weight_bytes
from scheduler.hf.sglang_fraction import mem_fraction_static
from scheduler.units import GiB


def test_qwen_7b_from_files(qwen7b_dir):
    # 4 shards + index; bf16 tensors sum to 15,231,233,024 B (estimation.md §3.4)
    weights, files = directory_weight_bytes(qwen7b_dir)
    assert weights == 15_231_233_024 and len(files) == 4
    p = load_parameters(qwen7b_dir)
    assert p.source == "config.json"  # a qwen2 config stating every key: read without transformers
    assert replace(load_parameters(qwen7b_dir, transformers=True), source="config.json") == p  # as AutoConfig reads it
    assert (p.num_layers, p.num_attention_heads, p.num_kv_heads, p.head_dim) == (28, 28, 4, 128)
    # R13: 2 * 28 layers * 4 kv heads * 128 * 2 B = 57,344 B per token
    assert claims.kv_bytes_per_token(p) == 57_344
    # with tp=2 each GPU holds 2 kv heads: half
    assert claims.kv_bytes_per_token(p, tp=2) == 28_672


def test_llama3_single_file(tmp_path):
    d = llama_like_hf(str(tmp_path / "l3"), layers=32, hidden=4096, ff=14336, heads=32, kv_heads=8, vocab=128256, max_pos=8192)
    assert directory_weight_bytes(d)[0] == 16_060_522_496
    assert claims.kv_bytes_per_token(load_parameters(d)) == 131_072


@pytest.mark.parametrize("weights, gib_claim", [
    # R10: int(W * 1.2) + 2 GiB
    (988_065_536, 3.10),        # Qwen2.5-0.5B
    (6_171_877_376, 8.90),      # Qwen2.5-3B
    (15_231_233_024, 19.02),    # Qwen2.5-7B
    (145_412_407_296, 164.51),  # Qwen2.5-72B
    (65_524_213_760, 75.23),    # Qwen3-32B (needs 75.23 / 0.9 = 83.59 GiB of cards)
])
def test_gpustack_vllm_claims(weights, gib_claim):
    assert round(claims.vram_claim(weights, []) / GiB, 2) == gib_claim


def test_claim_factors_by_category():
    w = 10 * GiB
    assert claims.vram_claim(w, ["text_to_speech"]) == 30 * GiB + 512 * 1024**2
    assert claims.vram_claim(w, ["embedding"]) == 12 * GiB + 512 * 1024**2
    assert claims.vllm_gmu(["embedding"], (), None) == 0.0
    assert claims.vllm_gmu(["embedding"], ("Qwen3ForCausalLM",), None) == 0.9
    assert claims.vllm_gmu([], (), 0.8) == 0.8


def test_tp_rules(qwen7b_dir):
    p = load_parameters(qwen7b_dir)
    assert claims.tp_problems(p, 4) == []  # 28 heads / 4, vocab 152064 / 4
    assert claims.tp_problems(p, 3) == [
        "Total number of attention heads (28) must be divisible by tensor parallel size (3).",
    ]
    assert "Vocabulary size (152064) must be divisible by tensor parallel size (5)." in claims.tp_problems(p, 5)


def test_raw_json_fallback_for_unknown_architecture(tmp_path):
    d = write_hf_model(str(tmp_path / "x"), {"architectures": ["FooForCausalLM"], "model_type": "foo-unknown",
                                            "hidden_size": 512, "num_attention_heads": 8, "num_hidden_layers": 4,
                                            "vocab_size": 1000}, {"w": ("F16", [512, 512])})
    p = load_parameters(d)
    assert p.source == "config.json" and p.head_dim == 64 and p.num_kv_heads == 8


def test_multimodal_nested_text_config(tmp_path):
    d = write_hf_model(str(tmp_path / "vl"), {"architectures": ["FooVL"], "model_type": "foo-vl",
                                             "text_config": {"hidden_size": 1024, "num_attention_heads": 16,
                                                             "num_key_value_heads": 4, "num_hidden_layers": 8, "vocab_size": 3200},
                                             "vision_config": {"num_attention_heads": 12}}, {"w": ("BF16", [8])})
    p = load_parameters(d)
    assert (p.num_attention_heads, p.num_kv_heads, p.vision_num_attention_heads) == (16, 4, 12)
    assert "vision attention heads (12)" in claims.tp_problems(p, 8)[0]


def test_bad_hf_inputs(tmp_path):
    with pytest.raises(ModelFileError, match="no config.json"):
        load_parameters(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelFileError, match="not valid JSON"):
        load_parameters(str(tmp_path))
    bad = tmp_path / "model.safetensors"
    bad.write_bytes((10**12).to_bytes(8, "little") + b"{}")
    with pytest.raises(ModelFileError, match="header length 1000000000000 does not fit"):
        directory_weight_bytes(str(tmp_path))
    raw = json.dumps({"t": {"dtype": "F16", "shape": [4], "data_offsets": [0, 800]}}).encode()
    bad.write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0" * 8)
    with pytest.raises(ModelFileError, match="outside the 8 data bytes"):
        directory_weight_bytes(str(tmp_path))



@pytest.mark.parametrize("mib, tp, frac", [
    # reserved = 512 + max(cp,2048)*1.5 + bs*2 + tp/8*1024, >= 10240 over 60 GiB
    (24810, 1, 0.848),   # RTX 4090: cp 2048, bs 24: 512+3072+48+128 = 3760 -> (24810-3760)/24810
    (81920, 1, 0.836),   # H100 80G: cp 8192, bs 256: 512+12288+512+128 = 13440
    (81920, 8, 0.819),   # H100 tp 8: bs 512, 512+12288+1024+1024 = 14848
    (144492, 1, 0.907),  # H200
    (16376, 1, 0.772),   # RTX 4080
])
def test_sglang_mem_fraction(mib, tp, frac):
    assert mem_fraction_static(mib, tp) == frac


@pytest.mark.parametrize("config, named", [
    ({"num_attention_heads": 0}, "num_attention_heads is 0: must be 1..65536"),
    ({"num_hidden_layers": 0}, "num_hidden_layers is 0"),
    ({"num_hidden_layers": 10**9}, "num_hidden_layers is 1000000000: must be 1..1024"),
    ({"vocab_size": 0}, "vocab_size is 0"),
    ({"hidden_size": -4096}, "hidden_size is -4096"),
    ({"max_position_embeddings": 0}, "max_position_embeddings is 0"),
    ({"max_position_embeddings": 1e30}, "max_position_embeddings is 1e+30"),
    ({"num_key_value_heads": 64}, "num_key_value_heads is 64, more than num_attention_heads (32)"),
    ({"text_config": {"num_attention_heads": 0}}, "text_config.num_attention_heads is 0"),
])
def test_absurd_config_values_are_refused_naming_the_key(tmp_path, config, named):
    """A llama config (4096 wide, 32 heads, 32 layers, 128256 tokens) with one value made
    impossible: refused, the key named, whether transformers knows the architecture or not."""
    base = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256,
            "max_position_embeddings": 8192}
    for model_type in ("llama", "foo-unknown"):
        d = write_hf_model(str(tmp_path / model_type), {**base, "model_type": model_type, **config},
                           {"w": ("F16", [8])})
        with pytest.raises(ModelFileError) as e:
            load_parameters(d)
        assert named in str(e.value), (model_type, str(e.value))
