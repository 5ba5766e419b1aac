"""The engines' answers correct the prefix index (gateway/index_feedback.py): an answer's
``cached_tokens`` drops what the index wrongly believed held, and sizes the LRU of a replica
whose engine never said its cache size. Tables; comments show the arithmetic."""

from __future__ import annotations

import random

import pytest

from store.serving import Route
from gateway.index_feedback import BEYOND, HIT, MISS, NONE, Verdict, apply, cached_tokens, held_blocks, judge
from gateway.prefix_index import PrefixIndex, block_hashes


@pytest.mark.parametrize("usage, want", [
    ({"prompt_tokens": 520, "prompt_tokens_details": {"cached_tokens": 496}}, (496, 520)),
    ({"prompt_tokens": 520, "prompt_tokens_details": {"cached_tokens": 0}}, (0, 520)),  # a miss is evidence too
    ({"prompt_tokens_details": {"cached_tokens": 16}}, (16, 0)),  # no prompt count: 0, the ratio is then 4
    ({"prompt_tokens": 520, "prompt_tokens_details": None}, None),  # vLLM without prefix caching sends null
    ({"prompt_tokens": 520}, None),  # llama.cpp, older engines: no evidence
    ({"prompt_tokens": 520, "prompt_tokens_details": {"cached_tokens": -1}}, None),
    ({"prompt_tokens": 520, "prompt_tokens_details": {"cached_tokens": True}}, None),  # a bool is no count
    ({"prompt_tokens": 520, "prompt_tokens_details": {"cached_tokens": "496"}}, None),
    (None, None), ([1], None),
])
def test_cached_tokens_are_read_only_when_the_engine_said_them(usage, want):
    assert cached_tokens(usage) == want


@pytest.mark.parametrize("cached, prompt, chars, blocks, whole, want", [
    (0, 520, 2080, 16, True, 0),
    # 496 of 520 tokens of 2,080 characters: 496 * 2080 // (520 * 128) = 15 blocks (15.5)
    (496, 520, 2080, 16, True, 15),
    # code at 3 characters a token: 2,080 characters are 693 tokens; 672 cached: 672 * 2080 // (693 * 128) = 15;
    # at 4 a token it would be 672 * 4 // 128 = 21 > 16 blocks: the prompt's own ratio is why the share is used
    (672, 693, 2080, 16, True, 15),
    (672, 693, 2080, 16, False, 16),  # read in part (over 128 KiB): 4 a token, 21, at most its 16 blocks
    (496, 0, 2080, 16, True, 15),  # no prompt count: 496 * 4 // 128 = 15
    (600, 520, 2080, 16, True, 16),  # more cached than prompted (nonsense): 600 * 4 // 128 = 18, at most 16
    (31, 520, 2080, 16, True, 0),  # under one block of 128 characters: 31 * 2080 // 66560 = 0
])
def test_cached_tokens_in_the_index_blocks(cached, prompt, chars, blocks, whole, want):
    assert held_blocks(cached, prompt, chars, blocks, 128, whole) == want


D = 16384  # --prefix-cache-blocks, the default


@pytest.mark.parametrize("believed, held, age, forgot, capacity, learn, want", [
    # the index believed 15 blocks held, the engine had none: all 16 of the prompt's leave; the first
    # was 40 blocks deep at most (age 40 + 0), so the engine keeps at most 40: the LRU shrinks 16,384 -> 40
    (15, 0, 40, False, D, True, Verdict(MISS, 0, 40)),
    (15, 0, 40, False, D, False, Verdict(MISS, 0, None)),  # its engine reported its size: only the drop
    (15, 7, 100, False, D, True, Verdict(MISS, 7, 107)),  # 2 * 7 = 14 < 15: blocks 7.. go; block 7 was 107 deep
    (15, 8, 100, False, D, True, Verdict(HIT)),  # 2 * 8 = 16 >= 15: a hit, the engine's blocks may differ a bit
    (15, 15, 3, False, 200, True, Verdict(HIT)),
    (15, 1, 500, False, D, True, Verdict(MISS, 1, 501)),  # only the header every prompt shares was cached
    (15, 0, 2, False, D, True, Verdict(MISS, 0, 16)),  # a restarted engine: 2 deep, but never under 16 (FLOOR)
    (15, 0, 100, False, 30, True, Verdict(MISS, 0, None)),  # a miss never grows it: min(30, 100) is 30 already
    # the index believed nothing, the engine had 15 blocks, and its LRU had let the first go: too small,
    # 40 -> ceil(40 * 1.25) = 50
    (0, 15, None, True, 40, True, Verdict(BEYOND, None, 50)),
    (0, 15, None, False, 40, True, Verdict(NONE)),  # never sent there, or dropped by a miss: no growth
    (4, 9, 5, True, 40, True, Verdict(HIT)),  # 9 > 2 * 4 + 1 = 9? no: within the units' slack
    (4, 10, 5, True, 40, True, Verdict(BEYOND, None, 50)),  # 10 > 9
    (0, 15, None, True, 16380, True, Verdict(BEYOND, None, D)),  # never over --prefix-cache-blocks
    (0, 15, None, True, D, True, Verdict(NONE)),  # at it already
    (0, 15, None, True, 40, False, Verdict(NONE)),  # a reported size is not learned
    (0, 0, None, False, D, True, Verdict(NONE)),
])
def test_the_correction_and_the_learned_capacity(believed, held, age, forgot, capacity, learn, want):
    assert judge(believed, held, 16, age, forgot, capacity, D, learn) == want


def hashes(tag: str, n: int) -> tuple[int, ...]:
    return block_hashes(tag * (128 * n), 128)


def test_age_counts_the_blocks_sent_since_and_forgot_tells_the_lru_from_a_drop():
    ix = PrefixIndex(capacity=10)
    x, y = hashes("x", 4), hashes("y", 6)
    ix.insert("r", x)
    assert ix.age("r", x[0]) == 0 and ix.age("r", y[0]) is None and ix.age("q", x[0]) is None
    ix.insert("r", y)  # 6 blocks sent after x: x's block 3 is 3 + 6 = 9 deep, the LRU's oldest of 10
    assert ix.age("r", x[0]) == 6 and ix.age("r", y[0]) == 0
    assert not ix.forgot("r", x[0])  # still held
    ix.insert("r", hashes("z", 2))  # 12 blocks sent, 10 kept: x's blocks 2 and 3 fell off its tail
    assert ix.matched("r", x) == 2 and ix.forgot("r", x[2]) and not ix.forgot("q", x[2])
    assert ix.drop("r", y) == 6 and ix.matched("r", y) == 0 and ix.size("r") == 4  # 10 - 6
    assert not ix.forgot("r", y[0])  # dropped by an answer, not let go by the LRU
    assert ix.home(y) == "r"  # its home stays


def test_a_learned_capacity_never_replaces_a_reported_one():
    ix = PrefixIndex(capacity=100)
    ix.set_capacity("a", 40, reported=False)
    assert ix.capacities["a"] == 40 and "a" not in ix.reported
    ix.set_capacity("a", 64)  # its engine answered the probe after all: reported wins
    ix.set_capacity("a", 20, reported=False)
    assert ix.capacities["a"] == 64 and "a" in ix.reported
    ix.forget("a")  # a new process: nothing known
    assert "a" not in ix.reported and "a" not in ix.capacities and "a" not in ix.clock


def test_a_spill_evicted_on_its_second_replica_stops_drawing_its_customer_there_after_one_answer():
    ix = PrefixIndex()  # 16,384 blocks a replica: far more than the engines hold
    p = hashes("p", 15)
    ix.insert("a", p)
    ix.insert("b", p, home=False)  # the guard spilled it once onto b: its home stays a
    for i in range(30):  # b's engine then served 30 other prompts of 15 blocks: 450 blocks sent after p
        ix.insert("b", hashes(chr(0x100 + i), 15))
    assert ix.matched("a", p) == ix.matched("b", p) == 15 and ix.home(p) == "a"  # a tie: the customer alternates
    assert ix.age("b", p[0]) == 450
    v = apply(ix, "b", p, 15, 0, ix.age("b", p[0]), False)  # b answered with 0 cached tokens
    assert v == Verdict(MISS, 0, 450)  # the engine keeps at most 450 + 0 blocks (the clock: an upper bound)
    assert ix.matched("b", p) == 0 and ix.matched("a", p) == 15 and ix.home(p) == "a"  # only a is left
    assert ix.capacities["b"] == 450 and ix.size("b") == 450  # 465 held: the 15 dropped
    assert "a" not in ix.capacities  # a's own answers will size a


R = [Route(i, "m", "127.0.0.1", n) for n, i in enumerate(("a", "b"), 1)]


def usage(cached: int, prompt: int) -> dict:
    return {"prompt_tokens": prompt, "prompt_tokens_details": {"cached_tokens": cached}}


async def sent(b, model: str, text: str):
    """``text`` (blocks of 128 characters) routed by balancer ``b`` and its slot released at once:
    the prompt, with the choice made (a replica's, or a group's pick)."""
    from gateway.balance import Prompt

    p = Prompt(block_hashes(text, 128), chars=len(text))
    got, _ = await b.acquire(model, prompt=p)
    b.release(got, model)
    return p


async def test_the_balancer_weighs_each_answer_against_what_it_believed_when_it_chose():
    from gateway.balance import Balancer
    from gateway.table import build

    b = Balancer(queue_timeout_s=1, max_queue=10, bad_s=5, rng=random.Random(1))
    b.swap(build(R, {"m": {"max_concurrency": 8}}, 4))
    text = "s" * 2048  # 16 blocks of 128; 512 tokens at 4 characters a token

    first = await sent(b, "m", text)
    home = first.choice.route.instance
    assert b.answered(home, first, usage(0, 512), True) == Verdict(NONE)  # believed 0, had 0: nothing
    again = await sent(b, "m", text)
    assert (again.choice.route.instance, again.choice.matched, again.age) == (home, 16, 0)
    assert b.answered(home, again, usage(496, 512), True) == Verdict(HIT)  # 496 * 2048 // (512 * 128) = 15
    assert b.answered(home, again, None, True) is None  # no usage: no evidence
    assert b.answered("b" if home == "a" else "a", again, usage(0, 512), True) is None  # not the one chosen
    third = await sent(b, "m", text)
    # its engine restarted: 0 cached where 16 blocks were believed held, the latest sent (age 0): 0 + 0, FLOOR 16.
    # Home: nothing dropped, as its engine prefilled the 16 blocks for this answer and holds them now
    assert b.answered(home, third, usage(0, 512), True) == Verdict(MISS, None, 16)
    assert b.index.matched(home, third.blocks) == 16 and b.index.capacities[home] == 16
    fourth = await sent(b, "m", text)  # home again, held there: the engine's answer agrees
    assert fourth.choice.route.instance == home and fourth.choice.matched == 16
    assert b.answered(home, fourth, usage(496, 512), True) == Verdict(HIT)


async def test_a_groups_prefill_answer_corrects_the_prefill_and_nothing_else():
    # a prefill/decode group (mode custom: vLLM's hand-off): the prefill is the end chosen by cache, so its answer
    # (max_tokens 1, not streamed) is the evidence; the decode's answer and a decode's retry are not
    from dataclasses import replace

    from gateway.balance import Balancer, Prompt
    from gateway.pd_pick import DISAGGREGATED
    from gateway.table import build
    from store.serving import Members

    def member(name, role, worker="w1"):
        return Route(name, "pd", "127.0.0.1", 9000, role=role, group_gen=0, worker=worker)

    ends = (member("p0", "prefill"), member("p1", "prefill", "w2"), member("d0", "decode"))
    b = Balancer(queue_timeout_s=1, max_queue=10, bad_s=5, rng=random.Random(1))
    spec = {"name": "pd", "backend": "custom", "roles": [{"name": "prefill"}, {"name": "decode"}],
            "max_concurrency": 8, "disaggregation": {"mode": "custom", "skip_prefill_below": 64}}
    b.swap(build([], {"pd": spec}, 4, members={"pd": Members(ends)}))
    text = "g" * 2048  # 16 blocks of 128; 512 tokens

    first = await sent(b, "pd", text)
    pre = first.pick.prefill.instance
    assert first.pick.path == DISAGGREGATED and first.pick.choice.matched == 0
    assert b.answered(pre, first, usage(0, 512), True) == Verdict(NONE)  # believed 0, had 0
    again = await sent(b, "pd", text)  # 2048 chars, all on the decode: 512 - 512 * 2048 // 2048 = 0 uncached: skipped
    assert again.pick.prefill is None and b.answered("d0", again, usage(0, 512), True) is None
    # a long enough new tail makes it disaggregated again: the prefill chosen by its 16 blocks
    text += "h" * 2048
    third = await sent(b, "pd", text)
    assert third.pick.path == DISAGGREGATED and (third.pick.prefill.instance, third.pick.choice.matched) == (pre, 16)
    assert b.answered("d0", third, usage(0, 1024), True) is None  # the decode's answer: not evidence
    retry = Prompt(third.blocks, chars=third.chars, pick=replace(third.pick, retry=True), choice=third.choice)
    assert b.answered(pre, retry, usage(0, 1024), True) is None  # a decode's retry: the prefill was weighed once
    # the prefill's engine had none of it (restarted): 16 believed, 0 held, age 0: learned 0 + 0 -> FLOOR 16;
    # the prefill is the prompt's home, whose engine has just prefilled it: kept
    assert b.index.home(third.blocks) == pre
    assert b.answered(pre, third, usage(0, 1024), True) == Verdict(MISS, None, 16)
    assert b.index.matched(pre, third.blocks[:16]) == 16 and b.index.capacities[pre] == 16
