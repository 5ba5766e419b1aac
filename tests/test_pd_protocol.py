"""What the gateway sends a group's ends and what it accepts back (gateway/pd_protocol.py), as
tables: vLLM's two phases, SGLang's bootstrap, and a prefill's answer checked field by field."""

from __future__ import annotations

import json
import random

import pytest

from store.serving import Route
from gateway.pd_protocol import MAX_KEYS, BadAnswer, bootstrap_body, decode_body, kv_params, prefill_body

ASK = {"model": "pd", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 50,
       "max_completion_tokens": 50, "stream_options": {"include_usage": True}}
GOOD = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "e1", "remote_block_ids": [1, 2],
        "remote_host": "10.0.0.1", "remote_port": 5600, "tp_size": 1}


def test_vllm_prefill_then_decode_bodies():
    p = json.loads(prefill_body(ASK))
    # one token, not streamed, no stream_options, the KV kept for a decode elsewhere; the rest as asked
    assert p == {"model": "pd", "messages": ASK["messages"], "stream": False, "max_tokens": 1,
                 "max_completion_tokens": 1, "kv_transfer_params": {"do_remote_decode": True,
                                                                    "do_remote_prefill": False}}
    assert json.loads(decode_body(ASK, GOOD)) == {**ASK, "kv_transfer_params": GOOD}  # the original, with the KV's


def test_sglang_bootstrap_names_the_prefill_and_a_room():
    pre = Route("p0", "pd", "10.0.0.7", 8000, role="prefill", bootstrap_port=8998)
    b = json.loads(bootstrap_body(ASK, pre, random.Random(1)))
    assert (b["bootstrap_host"], b["bootstrap_port"]) == ("10.0.0.7", 8998) and 0 <= b["bootstrap_room"] < 2**63
    assert {k: v for k, v in b.items() if not k.startswith("bootstrap_")} == ASK  # both ends get the same request
    assert bootstrap_body(ASK, Route("p1", "pd", "10.0.0.7", 8000, role="prefill"), random.Random(1)) is None


@pytest.mark.parametrize("answer,error", [
    ({"kv_transfer_params": GOOD}, None),
    ({"kv_transfer_params": {**GOOD, "mooncake_session": "x"}}, None),  # a connector's own key passes through
    ({"choices": []}, "has no kv_transfer_params"),  # a prefill with no connector: the silent collapse
    ({"kv_transfer_params": {}}, "has no kv_transfer_params"),
    ({"kv_transfer_params": "x"}, "has no kv_transfer_params"),
    ({"kv_transfer_params": {**GOOD, "do_remote_prefill": False}}, "do_remote_prefill: not true"),
    ({"kv_transfer_params": {**GOOD, "remote_port": 70000}}, "remote_port"),  # 70000 > 65535
    ({"kv_transfer_params": {**GOOD, "remote_port": "5600"}}, "remote_port"),  # strict: a string is not a port
    ({"kv_transfer_params": {**GOOD, "remote_block_ids": [-1]}}, "remote_block_ids.0"),
    ({"kv_transfer_params": {**GOOD, "remote_host": "h" * 254}}, "remote_host"),  # 254 > 253 characters
    ({"kv_transfer_params": {**GOOD, **{f"k{i}": 1 for i in range(MAX_KEYS)}}}, "more than 64"),  # 71 keys
    ([1], "has no kv_transfer_params"),
])
def test_a_prefills_answer_is_checked(answer, error):
    raw = json.dumps(answer).encode()
    if error is None:
        assert kv_params(raw) == answer["kv_transfer_params"]
    else:
        with pytest.raises(BadAnswer, match=error):
            kv_params(raw)
    with pytest.raises(BadAnswer, match="not JSON"):
        kv_params(b"{nope")
