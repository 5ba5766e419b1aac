"""An engine's reported cache size (gateway/engine_cache.py): where vLLM, SGLang and llama.cpp's
server say it, what is refused, and what it becomes in the prefix index's blocks of text."""

from __future__ import annotations

import json

import pytest

from gateway import engine_cache as ec
from gateway.prefix_index import PrefixIndex

VLLM = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",num_gpu_blocks="%s"} 1.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 0.0
"""
SGLANG = """# HELP sglang:max_total_num_tokens Maximum total number of tokens
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{model_name="m"} %s
"""


@pytest.mark.parametrize("text, want", [
    (VLLM % "27000", (432_000, 16)),  # 27,000 blocks x 16 tokens
    (SGLANG % "161721.0", (161_721, None)),
    (VLLM % "None" + SGLANG % "5000", (5_000, None)),  # vLLM's label unusable: SGLang's gauge still read
    (VLLM % "None", None),  # before vLLM knows its blocks, the label reads None
    (VLLM % "0", None),
    (VLLM % "-5", None),
    (VLLM % "99999999999999", None),  # over 12 digits
    (VLLM % "5000000", None),  # 80 M tokens: over MAX_TOKENS (64 M)
    (SGLANG % "NaN", None),
    (SGLANG % "0", None),
    ("vllm:num_requests_running 3\n", None),
    ("this is { not prometheus", None),
    ("", None),
])
def test_tokens_from_metrics(text, want):
    assert ec.tokens_from_metrics(text) == want


@pytest.mark.parametrize("body, want", [
    (json.dumps({"default_generation_settings": {"n_ctx": 65536}, "total_slots": 4}), 65536),
    (json.dumps({"n_ctx": 4096}), 4096),  # older builds put it at the top
    (json.dumps({"default_generation_settings": {"n_ctx": "4096"}}), None),
    (json.dumps({"default_generation_settings": {"n_ctx": True}}), None),
    (json.dumps({"default_generation_settings": {"n_ctx": 0}}), None),
    (json.dumps([1, 2]), None),
    ("{", None),
    ("[" * 100000, None),  # too deep for json: refused, not a crash
])
def test_tokens_from_props(body, want):
    assert ec.tokens_from_props(body) == want


@pytest.mark.parametrize("tokens, block_chars, blocks", [
    (432_000, 128, 13_500),  # 432,000 tokens x 4 characters / 128
    (4096, 128, 128),  # the stand-in's 256 blocks of 64 characters: 16,384 characters
    (10, 128, 1),  # 40 characters: less than a block, still 1
])
def test_text_blocks(tokens, block_chars, blocks):
    assert ec.text_blocks(tokens, block_chars) == blocks


async def test_probe_asks_metrics_then_props():
    asked = []
    answers = {"http://e:1/metrics": "nothing here 1\n", "http://e:1/props": json.dumps({"n_ctx": 2048})}

    async def fetch(url):
        asked.append(url)
        return answers.get(url)
    assert await ec.probe("http://e:1", fetch) == (2048, None)
    assert asked == ["http://e:1/metrics", "http://e:1/props"]
    asked.clear()
    answers["http://e:1/metrics"] = VLLM % "100"
    assert await ec.probe("http://e:1", fetch) == (1600, 16)
    assert asked == ["http://e:1/metrics"]


def test_a_reported_size_shrinks_that_replicas_lru_only():
    ix = PrefixIndex(capacity=100)
    ix.insert("a", tuple(range(50)))
    ix.insert("b", tuple(range(100, 150)))
    ix.set_capacity("a", 20)  # a's engine holds 20 blocks: its oldest 30 go now
    assert (ix.size("a"), ix.size("b"), ix.total) == (20, 50, 70)
    ix.insert("a", tuple(range(200, 230)))
    assert ix.size("a") == 20
    assert ix.matched("a", tuple(range(200, 230))) == 20  # the head of the newest prompt stays
    ix.forget("a")
    ix.insert("a", tuple(range(50)))
    assert ix.size("a") == 50  # gone from the table and back: the default again until it reports
