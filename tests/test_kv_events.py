"""Engines' KV-cache events: decoding vLLM's wire format (gateway/kv_events.py), good, bad and
malformed, and the exact per-replica index built from them (gateway/token_index.py): store,
remove, clear, orphans, bounds. Payloads are built with msgpack by hand, field by field as vLLM's
msgspec structs encode them (array_like, the class name as the tag), not with our own encoder."""

from __future__ import annotations

import msgpack
import pytest

from gateway import kv_events as kv
from gateway.kv_events import Batch, BadEvents, Cleared, Removed, Skipped, Stored, decode, encode
from gateway.token_index import TokenIndex, token_hashes


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


T8 = list(range(100, 108))  # two blocks of 4 tokens


@pytest.mark.parametrize("payload, want", [
    # vLLM's array_like batch: [ts, events, data_parallel_rank]; BlockStored is
    # [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]
    ([1.5, [["BlockStored", [11, 12], None, T8, 4, None, "GPU"]], 0],
     Batch(1.5, (Stored((11, 12), None, tuple(T8), 4),), 0)),
    # older builds: no data_parallel_rank, no medium, no lora_id (2 blocks x 4 = 8 tokens)
    ([2, [["BlockStored", [11, 12], 10, T8, 4]]], Batch(2.0, (Stored((11, 12), 10, tuple(T8), 4),), None)),
    # newer builds: bytes hashes (sha256), trailing fields (lora_name, extra_keys, group_idx) ignored
    ([3.0, [["BlockStored", [b"\x01" * 32], None, T8[:4], 4, None, "GPU", None, None, 0]], None],
     Batch(3.0, (Stored((b"\x01" * 32,), None, tuple(T8[:4]), 4),), None)),
    ([4.0, [["BlockRemoved", [11, 12], "GPU"], ["AllBlocksCleared"]], 0],
     Batch(4.0, (Removed((11, 12)), Cleared()), 0)),
    # the map form ({"type": tag, field: value}) of the same events
    ({"ts": 5.0, "events": [{"type": "BlockRemoved", "block_hashes": [7], "medium": None},
                            {"type": "BlockStored", "block_hashes": [8], "parent_block_hash": None,
                             "token_ids": T8[:4], "block_size": 4, "lora_id": None, "medium": "GPU"}],
      "data_parallel_rank": 1},
     Batch(5.0, (Removed((7,)), Stored((8,), None, tuple(T8[:4]), 4)), 1)),
    # another tier, or a LoRA adapter's blocks: read, and skipped
    ([6.0, [["BlockRemoved", [11], "CPU"], ["BlockStored", [11], None, T8[:4], 4, 3, "GPU"]], 0],
     Batch(6.0, (Skipped("medium CPU"), Skipped("lora")), 0)),
    ([7.0, [], 0], Batch(7.0, (), 0)),
])
def test_good_batches_decode(payload, want):
    assert decode(pack(payload)) == want


@pytest.mark.parametrize("payload, problem", [
    (b"\xc1", "not msgpack"),  # 0xc1 is never used in msgpack
    (pack([1.0, [], 0]) + b"\x00", "not msgpack"),  # extra data after the batch
    (pack({"ts": 1.0}), "events is not a list"),
    (pack([1.0]), "a batch is"),
    (pack(["now", [], 0]), "ts is str"),
    (pack([1.0, [], -1]), "data_parallel_rank"),
    (pack([1.0, [["BlockEvicted", [1]]], 0]), "unknown type 'BlockEvicted'"),
    (pack([1.0, [[1, 2, 3]], 0]), "neither a tagged array nor a map"),
    (pack([1.0, [["BlockStored", [1], None, T8[:4]]], 0]), "3 fields, needs 4"),
    (pack([1.0, [{"type": "BlockStored", "block_hashes": [1]}], 0]), "missing parent_block_hash"),
    # 2 hashes x block_size 4 needs 8 tokens, 7 given
    (pack([1.0, [["BlockStored", [1, 2], None, T8[:7], 4, None, "GPU"]], 0]), "block_size (4) tokens per block"),
    (pack([1.0, [["BlockStored", [1], None, [1, 2, 3, -4], 4, None, "GPU"]], 0]), "a token id"),
    (pack([1.0, [["BlockStored", [1], None, [1, 2, 3, "4"], 4, None, "GPU"]], 0]), "a token id"),
    (pack([1.0, [["BlockStored", [1], None, [], 0, None, "GPU"]], 0]), "block_size is not an integer"),
    (pack([1.0, [["BlockStored", [1], None, [1] * 2048, 2048, None, "GPU"]], 0]), "block_size is not an integer"),
    (pack([1.0, [["BlockRemoved", [1.5], "GPU"]], 0]), "a block hash is float"),
    (pack([1.0, [["BlockRemoved", [True], "GPU"]], 0]), "a block hash is bool"),
    (pack([1.0, [["BlockRemoved", [b"x" * 65], "GPU"]], 0]), "not msgpack"),  # over max_bin_len (64)
    (pack([1.0, [["BlockRemoved", 5, "GPU"]], 0]), "block_hashes is not a list"),
    (pack([1.0, [["BlockRemoved", [1], 7]], 0]), "medium is not a string"),
    (pack([1.0, [["AllBlocksCleared"]] * (kv.MAX_EVENTS + 1), 0]), "over 4096"),
    (pack([1.0, [["BlockRemoved", list(range(kv.MAX_BLOCKS + 1)), "GPU"]], 0]), "at most 8192"),
    (b"\x92" + b"\x91" * 5000, "not msgpack"),  # nested 5,000 deep
    (b"\x00" * (kv.MAX_PAYLOAD + 1), "over"),
])
def test_bad_batches_are_refused_with_the_reason(payload, problem):
    with pytest.raises(BadEvents, match=problem.replace("(", r"\(").replace(")", r"\)")):
        decode(payload)


def test_our_encoder_writes_vllms_array_form():
    b = Batch(1.0, (Stored((5, 6), 4, tuple(T8), 4), Removed((5,)), Cleared()), 0)
    assert msgpack.unpackb(encode(b)) == [1.0, [["BlockStored", [5, 6], 4, T8, 4, None, "GPU"],
                                                ["BlockRemoved", [5], "GPU"], ["AllBlocksCleared"]], 0]
    assert decode(encode(b)) == b


# --- the exact index ----------------------------------------------------------------------------------

A, B = list(range(1, 9)), list(range(1, 5)) + [50, 51, 52, 53]  # share their first block of 4 tokens


def stored(hashes, parent, tokens, size=4) -> Batch:
    return Batch(0.0, (Stored(tuple(hashes), parent, tuple(tokens), size),))


def test_token_hashes_chain_blocks_and_drop_a_partial_tail():
    h = token_hashes(list(range(10)), 4)  # 10 tokens: 2 whole blocks of 4, 2 left over
    assert len(h) == 2
    assert h[0] == token_hashes(list(range(4)), 4)[0]
    assert h[1] == token_hashes([4, 5, 6, 7], 4, parent=h[0])[0]  # block 2 chains on block 1
    assert h[1] != token_hashes([4, 5, 6, 7], 4)[0]  # the same tokens from the start are another prefix


def test_store_then_match_by_leading_blocks():
    ix = TokenIndex()
    d = ix.apply("r", stored([901, 902], None, A))  # the engine's hashes are anything: 901, 902
    assert (d.stored, ix.block_size("r"), ix.size("r")) == (2, 4, 2)
    assert ix.matched("r", token_hashes(A, 4)) == 2
    assert ix.matched("r", token_hashes(B, 4)) == 1  # B shares A's first block only
    assert ix.matched("r", token_hashes(A[4:] + A[:4], 4)) == 0  # the second block alone is not a prefix
    assert ix.matched("other", token_hashes(A, 4)) == 0


def test_a_child_event_chains_on_its_parents_engine_hash():
    ix = TokenIndex()
    ix.apply("r", stored([901], None, A[:4]))
    ix.apply("r", stored([902], 901, A[4:]))  # vLLM sends the second block later, naming its parent
    assert ix.matched("r", token_hashes(A, 4)) == 2


def test_an_unknown_parent_is_an_orphan_never_a_guess():
    ix = TokenIndex()
    d = ix.apply("r", stored([902, 903], 777, A))  # parent 777 was never seen (stored before we subscribed)
    assert (d.orphans, d.stored, ix.size("r")) == (2, 0, 0)


def test_removed_then_the_match_stops_at_the_gap():
    ix = TokenIndex()
    ix.apply("r", stored([901, 902], None, A))
    d = ix.apply("r", Batch(0.0, (Removed((901, 999)),)))  # 999 unknown: ignored
    assert d.removed == 1
    assert ix.matched("r", token_hashes(A, 4)) == 0  # block 1 gone: block 2 is no usable prefix
    assert ix.size("r") == 1


def test_a_block_named_by_two_engine_hashes_stays_while_either_holds_it():
    ix = TokenIndex()
    ix.apply("r", stored([901], None, A[:4]))
    ix.apply("r", stored([801], None, A[:4]))  # the same prefix under another engine hash (a cache salt)
    ix.apply("r", Batch(0.0, (Removed((901,)),)))
    assert ix.matched("r", token_hashes(A, 4)) == 1
    ix.apply("r", Batch(0.0, (Removed((801,)),)))
    assert ix.matched("r", token_hashes(A, 4)) == 0
    assert ix.total == 0


def test_cleared_and_forgotten():
    ix = TokenIndex()
    ix.apply("r", stored([901, 902], None, A))
    ix.apply("s", stored([901], None, B[:4]))
    ix.live |= {"r", "s"}
    ix.apply("r", Batch(0.0, (Cleared(),)))
    assert (ix.size("r"), ix.total) == (0, 1)
    assert "r" in ix.live  # cleared, still publishing
    ix.keep_only(["r"])
    assert (ix.size("s"), ix.total, ix.live) == (0, 0, {"r"})


def test_other_block_sizes_and_skipped_events_are_not_indexed():
    ix = TokenIndex()
    ix.apply("r", stored([901], None, A[:4]))
    d = ix.apply("r", Batch(0.0, (Stored((5,), None, tuple(A), 8), Skipped("lora"))))
    assert (d.skipped, d.stored, ix.size("r")) == (2, 0, 1)


@pytest.mark.parametrize("capacity_tokens, stored_blocks, kept", [
    (None, 10, 6),  # no report: the default (6 blocks here)
    (16, 10, 4),  # 16 tokens / 4 a block = 4 blocks: the first stored go first
    (1000, 10, 9),  # room for 250, but max_total is 9
])
def test_bounds(capacity_tokens, stored_blocks, kept):
    ix = TokenIndex(capacity=6, max_total=9)
    if capacity_tokens:
        ix.set_capacity("r", capacity_tokens)
    toks = list(range(4 * stored_blocks))
    ix.apply("r", stored(range(1000, 1000 + stored_blocks), None, toks))
    assert ix.size("r") == ix.total == kept
    assert ix.matched("r", token_hashes(toks, 4)) == 0  # the head went first: no usable prefix is left claimed


def test_the_total_bound_takes_from_the_biggest_replica():
    ix = TokenIndex(capacity=100, max_total=10)
    ix.apply("a", stored(range(100, 108), None, range(32)))  # 8 blocks
    ix.apply("b", stored(range(200, 204), None, range(32, 48)))  # 4 more: 12 > 10, a gives up 2
    assert (ix.size("a"), ix.size("b"), ix.total) == (6, 4, 10)


def test_eviction_at_the_cap_follows_the_order_stored_and_gives_memory_back():
    # capacity 1000 blocks, 10 batches of 500 at the cap: 4,000 evicted, oldest first; a block removed
    # then stored again (engine hash 7) is young again, never taken for the oldest
    ix = TokenIndex(capacity=1000, max_total=10_000)
    for k in range(10):
        ix.apply("r", stored(range(k * 500, (k + 1) * 500), None, range(k * 2000, (k + 1) * 2000)))
    r = ix.replicas["r"]
    assert len(r.ours) == 1000 and min(r.ours) == 4000 and len(r.order) <= 2 * 1000 + 1024
    ix.apply("r", Batch(0.0, (Removed((4000,)),)))
    ix.apply("r", stored([4000], None, range(90_000, 90_004)))  # back, now the youngest
    ix.apply("r", stored([9999], None, range(91_000, 91_004)))  # one over the cap: 4001 goes, not 4000
    assert 4000 in r.ours and 4001 not in r.ours
    # 20,000 blocks stored, then all but 100 removed: the tables are rebuilt (a dict never shrinks)
    big = TokenIndex(capacity=100_000, max_total=100_000)
    big.apply("r", stored(range(20_000), None, range(80_000)))
    big.apply("r", Batch(0.0, (Removed(tuple(range(19_900))),)))
    br = big.replicas["r"]
    assert big.size("r") == 100 and br.peak == 100 and len(br.order) == 100


# --- the agent's part: which launches publish, and the flag it adds ---------------------------------

from contracts.agent import LaunchRequest  # noqa: E402
from worker_agent.engines import EngineConfig, custom_argv, kv_events_config, sglang_argv, vllm_argv  # noqa: E402
from worker_agent.engines import wants_kv_events  # noqa: E402


def launch(backend="vllm", params=(), **kw) -> LaunchRequest:
    return LaunchRequest(instance="m-0", model="m", backend=backend, gpu_indexes=[0], model_path="/models/m",
                         backend_parameters=list(params), **kw)


VLLM_KV = '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","topic":"kv-events"}'
SGLANG_KV = '{"publisher":"zmq","endpoint":"tcp://*:5557","topic":"kv-events"}'  # no enable_kv_cache_events in SGLang


@pytest.mark.parametrize("req, agent_flag, wants", [
    (launch("vllm"), True, True),
    (launch("sglang"), True, True),
    (launch("vllm"), False, False),  # the operator did not ask (--kv-events): nothing is published
    (launch("llama.cpp"), True, False),  # llama.cpp publishes no events
    (launch("vllm", ["--kv-events-config", "{}"]), True, False),  # the spec's own (if allowed): none of ours
    (launch("vllm", ["--kv-events-config={}"]), True, False),
    (launch("sglang", role="sglang-node"), True, False),  # only the server, rank 0
    (launch("custom", run_command="srv --port {port} --events {kv_events_port}"), False, True),
    (launch("custom", run_command="srv --port {port}"), True, False),
])
def test_which_launches_get_an_events_port(req, agent_flag, wants):
    assert wants_kv_events(req, EngineConfig(kv_events=agent_flag)) is wants


def test_the_flag_and_placeholder_the_agent_adds():
    assert kv_events_config("vllm", 5557) == VLLM_KV
    assert kv_events_config("sglang", 5557) == SGLANG_KV
    assert kv_events_config("vllm", None) is None
    cfg = EngineConfig(kv_events=True, kv_events_port=5557, allow_custom=True)
    v = vllm_argv(launch("vllm"), 8000, cfg)
    assert v[v.index("--kv-events-config") + 1] == VLLM_KV
    s = sglang_argv(launch("sglang"), 8000, cfg)
    assert s[s.index("--kv-events-config") + 1] == SGLANG_KV
    assert "--kv-events-config" not in vllm_argv(launch("vllm"), 8000, EngineConfig(kv_events=True))  # no port
    assert custom_argv(launch("custom", run_command="srv --events {kv_events_port}"), 8000, cfg) == \
        ["srv", "--events", "5557"]
