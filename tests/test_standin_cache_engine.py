"""The stand-in cache engine (tests/standin_cache_engine.py) that the routing tests and
bench/bench_routing.py measure against: its LRU frees a prompt's tail first, as vLLM does, and
``--cache-info no`` hides its cache size from /metrics (an engine the gateway must learn)."""

from __future__ import annotations

import time
import urllib.request

import pytest

from tests import gateway_stack as gs
from tests.standin_cache_engine import Cache

# Blocks of 1 character, so a prompt of n characters is n blocks.
EVICTION = [
    # (capacity, prompts in order, probe, characters of the probe cached)
    # "abcd" fills 4 of 4; "xy" (2 new blocks) frees 2: the tail "cd" first, so "ab" still hits
    (4, ["abcd", "xy"], "abcd", 2),
    # "xy" asked again refreshes it; "pq" then frees the two oldest, "b" then "a": nothing hits
    (4, ["abcd", "xy", "xy", "pq"], "abcd", 0),
    # a prompt asked again becomes freshest: "abcd" re-asked after "xy", then "pq" frees x, y
    (6, ["abcd", "xy", "abcd", "pq"], "abcd", 4),
    # one prompt longer than the cache: its head is what stays (6 of 8 blocks, "abcdef")
    (6, ["abcdefgh"], "abcdefgh", 6),
    # a prefix half evicted keeps its head: "zzw" (3 new blocks) frees "f", "e", "d"; "abc" hits
    (6, ["abcdef", "zzw"], "abcdef", 3),
]


@pytest.mark.parametrize("capacity,prompts,probe,cached", EVICTION)
def test_the_lru_frees_a_prompts_tail_first(capacity, prompts, probe, cached):
    c = Cache(capacity, 1)
    for p in prompts:
        c.lookup_and_fill(p)
    assert c.lookup_and_fill(probe) == cached


def _metrics(port: int) -> str:
    for _ in range(100):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return r.read().decode()
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the engine never answered /metrics")


@pytest.mark.parametrize("flag,reported", [("yes", True), ("no", False)])
def test_cache_info_no_hides_the_cache_size(flag, reported):
    e = gs.cache_engine("s", cache_info=flag, cache_blocks=77)
    try:
        m = _metrics(e.port)
    finally:
        e.stop()
    assert ('num_gpu_blocks="77"' in m) is reported
    assert "vllm:prefix_cache_queries_total" in m  # the hit counters stay either way
