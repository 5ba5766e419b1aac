"""The gateway's pure parts: the replica limit read from a spec, least-outstanding picking, and
the SSE reader that times content chunks."""

from __future__ import annotations

import random

import pytest

from store.serving import Route
from gateway.balance import pick
from gateway.metrics import SSEWatch
from gateway.table import build, replica_limit


@pytest.mark.parametrize("spec,limit", [
    ({"backend": "vllm", "backend_parameters": ["--max-num-seqs", "32"]}, 32),  # vLLM's own flag
    ({"backend": "vllm", "backend_parameters": ["--max-num-seqs=16"], "max_concurrency": 2}, 16),  # engine wins
    ({"backend": "llama.cpp", "backend_parameters": ["-np", "3"]}, 3),
    ({"backend": "llama.cpp", "backend_parameters": ["--parallel", "5", "-c", "4096"]}, 5),
    ({"backend": "sglang", "backend_parameters": ["--max-running-requests", "7"]}, 7),
    ({"backend": "llama.cpp", "backend_parameters": ["--parallel", "lots"], "max_concurrency": 6}, 6),  # bad flag: spec
    ({"backend": "custom", "backend_parameters": ["--parallel", "9"], "max_concurrency": 2}, 2),  # custom: no known flag
    ({"backend": "vllm"}, 4),  # nothing said: the gateway's default
    ({"backend": "vllm", "max_concurrency": True}, 4),  # not a number
])
def test_replica_limit(spec, limit):
    assert replica_limit(spec, default=4) == limit


def r(i: str) -> Route:
    return Route(instance=i, deployment="m", address="127.0.0.1", port=1)


@pytest.mark.parametrize("in_flight,bad,exclude,limit,expect", [
    ({"a": 2, "b": 1, "c": 3}, {}, (), 4, {"b"}),  # fewest in flight
    ({"a": 1, "b": 1, "c": 3}, {}, (), 4, {"a", "b"}),  # tie: either
    ({"a": 0, "b": 1, "c": 1}, {"a": 99.0}, (), 4, {"b", "c"}),  # a is marked bad until t=99 (now 10)
    ({"a": 0, "b": 1, "c": 1}, {"a": 5.0}, (), 4, {"a"}),  # its mark ran out at t=5
    ({"a": 0, "b": 1, "c": 2}, {}, ("a",), 4, {"b"}),  # a was tried already
    ({"a": 2, "b": 2, "c": 2}, {}, (), 2, set()),  # every replica at its limit 2: wait
])
def test_pick_least_outstanding(in_flight, bad, exclude, limit, expect):
    seen = {pick([r("a"), r("b"), r("c")], limit, in_flight, bad, 10.0, frozenset(exclude), random.Random(s))
            for s in range(40)}
    assert {x.instance for x in seen if x} == expect
    assert (None in seen) == (not expect)


def test_table_keeps_deployments_without_replicas_and_drops_routes_of_gone_ones():
    t = build([r("a"), Route("x-0", "x", "127.0.0.1", 2)], {"m": {}, "idle": {"max_concurrency": 2}}, 4)
    assert t.names() == ["idle", "m"]  # "x" is not an active deployment: its route is left out
    assert t.models["idle"].replicas == () and t.models["idle"].limit == 2
    assert [x.instance for x in t.models["m"].replicas] == ["a"]


def test_sse_watch_finds_content_chunks_across_reads_and_the_final_usage():
    w = SSEWatch()
    role = b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n'
    tok = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\ndata: [DONE]\n\n'
    assert w.feed(role) == 0  # a role delta carries no content
    assert w.feed(tok[:20]) == 0  # half an event: nothing yet
    assert w.feed(tok[20:]) == 1
    assert w.feed(tok + tok[:9]) == 1 and w.feed(tok[9:] + tok) == 2  # events split and joined across reads
    assert w.feed(usage) == 0 and w.usage == {"prompt_tokens": 3, "completion_tokens": 2}


async def test_balancer_queue_is_fifo_bounded_and_times_out():
    import asyncio

    from gateway.balance import Balancer, QueueFull, QueueTimeout

    b = Balancer(queue_timeout_s=0.3, max_queue=2, bad_s=5)
    b.swap(build([r("a")], {"m": {"max_concurrency": 1}}, 4))
    first, _ = await b.acquire("m")  # takes a's only slot
    order: list[int] = []

    async def wait(i):
        got, waited = await b.acquire("m")
        order.append(i)
        return got, waited

    w1, w2 = asyncio.create_task(wait(1)), asyncio.create_task(wait(2))
    await asyncio.sleep(0.01)
    assert b.depth("m") == 2
    with pytest.raises(QueueFull):  # max_queue 2: the third waits nowhere
        await b.acquire("m")
    b.release(first, "m")  # a's slot goes to the first in line...
    got, waited = await w1
    assert got.instance == "a" and waited > 0 and order == [1]
    with pytest.raises(QueueTimeout):  # ...and the second waits out its 0.3 s
        await w2
    assert b.depth("m") == 0 and b.in_flight == {"a": 1}
    b.release(got, "m")
    assert b.in_flight == {}


async def test_balancer_retry_skips_the_replica_it_left_and_a_new_replica_serves_the_queue():
    import asyncio

    from gateway.balance import Balancer

    b = Balancer(queue_timeout_s=5, max_queue=10, bad_s=5)
    b.swap(build([r("a")], {"m": {"max_concurrency": 1}}, 4))
    held, _ = await b.acquire("m")
    retry = asyncio.create_task(b.acquire("m", exclude=frozenset({"a"})))  # a failed this request once
    plain = asyncio.create_task(b.acquire("m"))
    await asyncio.sleep(0.01)
    b.release(held, "m")  # a is free, but the retry excluded it: the plain request behind takes it
    assert (await plain)[0].instance == "a"
    assert not retry.done()
    b.swap(build([r("a"), r("b")], {"m": {"max_concurrency": 1}}, 4))  # b comes up: the retry gets it
    assert (await retry)[0].instance == "b"
