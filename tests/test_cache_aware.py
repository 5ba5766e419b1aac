"""The cache-aware policy (gateway/cache_aware.py) as tables: matched blocks against in-flight
requests, the imbalance guard, and what is never done (flood a replica past its limit, pass over
an idle one for a busy one more than ``slack`` ahead). Comments show the arithmetic."""

from __future__ import annotations

import random

import pytest

from store.serving import Route
from gateway.balance import pick
from gateway.cache_aware import COPY, IMBALANCE, NO_PREFIX, PREFIX, Choice, Knobs, choose

R = [Route(i, "m", "127.0.0.1", 1) for i in ("a", "b", "c")]


def run(in_flight, matched, blocks=10, limit=8, knobs=Knobs(), bad=None, exclude=()):
    """Every replica the rule may pick over 40 draws, and the reasons it gave."""
    got = {choose(R, limit, in_flight, lambda i: matched.get(i, 0), blocks, knobs, random.Random(s), bad or {}, 10.0,
                  frozenset(exclude)) for s in range(40)}
    return {c.route.instance for c in got if c}, {c.reason for c in got if c}, None in got


@pytest.mark.parametrize("in_flight,matched,limit,expect,reason", [
    # slack = max(2, ceil(8 * 0.5)) = 4 for limit 8 (Knobs' defaults)
    ({}, {"b": 7}, 8, {"b"}, PREFIX),  # idle: the replica holding 7 of 10 blocks
    ({"b": 4}, {"b": 7}, 8, {"b"}, PREFIX),  # b at 4, least loaded 0: 4 <= 0 + 4, still a candidate
    ({"b": 5}, {"b": 7}, 8, {"a", "c"}, IMBALANCE),  # 5 > 0 + 4: b is left out, a or c (0 each) take it
    ({"a": 1, "b": 5, "c": 2}, {"b": 7}, 8, {"b"}, PREFIX),  # least loaded is 1: 5 <= 1 + 4
    ({"a": 1, "b": 6, "c": 5}, {"b": 7, "c": 6}, 8, {"c"}, IMBALANCE),  # b 6 > 1 + 4; c (5 <= 5) matches 6 > a's 0
    # a and b hold 6 blocks each, c none and idle: 1 <= 0 + 4, so a and b keep it (equal: at random)
    ({"a": 1, "b": 1}, {"a": 6, "b": 6}, 8, {"a", "b"}, PREFIX),
    ({"a": 5, "b": 5}, {"a": 6, "b": 6}, 8, {"c"}, IMBALANCE),  # 5 > 0 + 4: both out, c takes it (and caches it)
    ({"a": 2, "b": 1}, {"a": 6, "b": 6}, 8, {"b"}, PREFIX),  # equal matches: the fewer in flight
    ({"b": 8}, {"b": 7}, 8, {"a", "c"}, NO_PREFIX),  # b at its limit 8: not eligible; nobody else matches
    # no threshold: a prefix whose tail aged out of the index (1 of 10 blocks left) still goes home
    ({"b": 1}, {"b": 1}, 8, {"b"}, PREFIX),
    ({"b": 1}, {"b": 4, "c": 6}, 8, {"c"}, PREFIX),  # the longer match wins over the idler replica
    # limit 16 (the bench's): slack = max(2, ceil(16 * 0.5)) = 8; a stall of 5 or 8 keeps its prefixes
    ({"a": 1, "b": 6, "c": 1}, {"b": 9}, 16, {"b"}, PREFIX),  # 6 <= 1 + 8
    ({"a": 0, "b": 8, "c": 3}, {"b": 9}, 16, {"b"}, PREFIX),  # 8 <= 0 + 8
    ({"a": 0, "b": 9, "c": 3}, {"b": 9}, 16, {"a"}, IMBALANCE),  # 9 > 0 + 8: out; a (0) before c (3)
    # limit 64: slack = max(2, ceil(64 * 0.5)) = 32; least loaded a at 1: b (50) and c (40) > 1 + 32
    ({"a": 1, "b": 50, "c": 40}, {"b": 9, "c": 9}, 64, {"a"}, IMBALANCE),
    ({"a": 1, "b": 50, "c": 33}, {"b": 9, "c": 9}, 64, {"c"}, PREFIX),  # c: 33 <= 1 + 32
])
def test_matched_blocks_against_load(in_flight, matched, limit, expect, reason):
    picked, reasons, none = run(in_flight, matched, limit=limit)
    assert picked == expect and reasons == {reason} and not none


@pytest.mark.parametrize("knobs,in_flight,expect", [
    (Knobs(slack_min=0, slack_frac=0), {"b": 1}, {"a", "c"}),  # no slack: any gap sends it to the least loaded
    (Knobs(slack_min=5, slack_frac=0), {"b": 5}, {"b"}),  # 5 <= 0 + 5
    (Knobs(slack_min=0, slack_frac=0.25), {"b": 2}, {"b"}),  # ceil(8 * 0.25) = 2: 2 <= 2
    (Knobs(slack_min=0, slack_frac=0.25), {"b": 3}, {"a", "c"}),  # 3 > 2
])
def test_the_guard_knobs(knobs, in_flight, expect):
    assert run(in_flight, {"b": 7}, knobs=knobs)[0] == expect


@pytest.mark.parametrize("in_flight,bad,exclude,limit", [
    ({"a": 2, "b": 1, "c": 3}, {}, (), 4),  # fewest in flight
    ({"a": 1, "b": 1, "c": 3}, {}, (), 4),  # tie: either
    ({"a": 0, "b": 1, "c": 1}, {"a": 99.0}, (), 4),  # a is marked bad until t=99 (now 10)
    ({"a": 0, "b": 1, "c": 1}, {"a": 5.0}, (), 4),  # its mark ran out at t=5
    ({"a": 0, "b": 1, "c": 2}, {}, ("a",), 4),  # a was tried already
    ({"a": 2, "b": 2, "c": 2}, {}, (), 2),  # every replica at its limit 2: wait
])
@pytest.mark.parametrize("blocks,matched", [(0, {}), (5, {}), (0, {"a": 3})])  # no block, or none matched
def test_without_a_match_it_is_least_outstanding_draw_for_draw(in_flight, bad, exclude, limit, blocks, matched):
    for s in range(40):
        c = choose(R, limit, in_flight, lambda i: matched.get(i, 0), blocks, Knobs(), random.Random(s), bad, 10.0,
                   frozenset(exclude))
        p = pick(R, limit, in_flight, bad, 10.0, frozenset(exclude), random.Random(s))
        assert (c.route if c else None) == p
        assert c is None or (c.reason, c.matched) == (NO_PREFIX, 0)


@pytest.mark.parametrize("blocks,in_flight,held,expect", [
    (5, {}, {"a": 90, "b": 10, "c": 40}, {"b"}),  # a new prefix, all idle: the replica with the most room
    (5, {"b": 4}, {"a": 90, "b": 10, "c": 40}, {"b"}),  # b busier, but within the slack (4 <= 0 + 4): room first
    (5, {"b": 5}, {"a": 90, "b": 10, "c": 40}, {"c"}),  # b 5 > 0 + 4: out; then room (c 40 < a 90)
    (5, {}, {"a": 10, "b": 10, "c": 40}, {"a", "b"}),  # equal room: at random
    (5, {}, {"a": 90, "b": 10, "c": 14}, {"b", "c"}),  # c holds 4 more, under the prompt's 5: as much room
    (5, {}, {"a": 90, "b": 10, "c": 15}, {"b"}),  # 5 more: b has more room
    (0, {}, {"a": 90, "b": 10, "c": 40}, {"a", "b", "c"}),  # under a block: plain least outstanding
])
def test_a_new_prefix_goes_where_there_is_room(blocks, in_flight, held, expect):
    got = {choose(R, 8, in_flight, lambda i: 0, blocks, Knobs(), random.Random(s), held=held.get).route.instance
           for s in range(40)}
    assert got == expect


@pytest.mark.parametrize("in_flight,held,turn,expect", [
    # turn: when each last took a new prefix (0: never)
    ({}, {"a": 128, "b": 128, "c": 128}, {"a": 3, "b": 1, "c": 2}, {"b"}),  # every LRU full: b's turn (longest ago)
    ({}, {"a": 128, "b": 128, "c": 128}, {"a": 0, "b": 0, "c": 2}, {"a", "b"}),  # never, both: at random
    ({}, {"a": 128, "b": 90, "c": 128}, {"a": 0, "b": 5, "c": 0}, {"b"}),  # room comes first: b holds least
    ({"b": 5}, {"a": 128, "b": 128, "c": 128}, {"a": 3, "b": 0, "c": 2}, {"c"}),  # b 5 > 0 + 4: the guard first
    ({"a": 2}, {"a": 128, "b": 128, "c": 128}, {"a": 0, "b": 1, "c": 2}, {"a"}),  # before load: 2 <= 0 + 4
    # a replica whose cache size is not known (held None: prefix_index.fill): its count of blocks says how busy
    # it was, not how full; room is not read for anyone, and the turn alone decides
    ({}, {"a": None, "b": 90, "c": 600}, {"a": 3, "b": 1, "c": 0}, {"c"}),  # by room b; by turn c (never)
    ({}, {"a": None, "b": None, "c": None}, {"a": 3, "b": 1, "c": 2}, {"b"}),
])
def test_with_as_much_room_new_prefixes_go_round_the_replicas(in_flight, held, turn, expect):
    got = {choose(R, 8, in_flight, lambda i: 0, 5, Knobs(), random.Random(s), held=held.get,
                  new_turn=turn.get).route.instance for s in range(40)}
    assert got == expect


def test_new_prefixes_are_shared_out_evenly_once_every_lru_is_full():
    """The routing bench's second round: unique prompts (each a new prefix too) filled every
    replica's LRU and the homes, then 16 customers' prefixes arrive anew. By room alone every
    replica ties (128 blocks held) and the least loaded takes it, at random: 16 over 4 put 6 or
    more on one replica in about a third of the draws (one more than the 5.3 prefixes its cache
    holds). Round the replicas: 4 each, whatever came before."""
    from gateway.prefix_index import PrefixIndex, block_hashes

    reps = [Route(i, "m", "127.0.0.1", 1) for i in ("a", "b", "c", "d")]
    worst = {}
    for turns in (False, True):
        worst[turns] = 0
        for seed in range(30):
            idx, rng = PrefixIndex(capacity=128), random.Random(seed)

            def place(blocks) -> str:
                c = choose(reps, 16, {}, lambda i: idx.matched(i, blocks), len(blocks), Knobs(), rng,
                           held=idx.size, home=idx.home(blocks), new_turn=idx.new_turn if turns else None)
                assert c.reason == NO_PREFIX and c.matched == 0 and idx.home(blocks) is None
                idx.insert(c.route.instance, blocks)
                idx.placed_new(c.route.instance)
                return c.route.instance

            for n in range(400):  # unique prompts of 26 blocks, placed by the same rule
                place(block_hashes(f"unique {n} " + "x" * 3400))
            spread = {r.instance: 0 for r in reps}
            for customer in range(16):
                spread[place(block_hashes(f"customer {customer} system prompt " + "y" * 3100))] += 1
            worst[turns] = max(worst[turns], max(spread.values()))
    assert worst[True] == 4  # 16 / 4, every seed
    assert worst[False] >= 6  # at random, some seed put 6 or more on one replica


@pytest.mark.parametrize("in_flight,matched,home,expect", [
    ({}, {}, "c", {"c"}),  # aged out of the index (nothing matched): back to c, though b has the most room
    ({"c": 4}, {}, "c", {"c"}),  # c busier, within the slack (4 <= 0 + 4): still home
    ({"c": 5}, {}, "c", {"b"}),  # 5 > 0 + 4: the guard leaves c out; then room (b holds 10, a 90)
    ({"c": 8}, {}, "c", {"b"}),  # c at its limit 8: not eligible
    ({}, {"a": 3}, "c", {"a"}),  # a match, however short, comes before a home
    ({}, {}, "gone", {"b"}),  # a home no longer in the table: room decides
])
def test_a_prefix_that_aged_out_of_the_index_goes_home(in_flight, matched, home, expect):
    held = {"a": 90, "b": 10, "c": 40}
    got = {choose(R, 8, in_flight, lambda i: matched.get(i, 0), 5, Knobs(), random.Random(s), held=held.get,
                  home=home).route.instance for s in range(40)}
    assert got == expect


def test_bad_and_excluded_replicas_are_never_chosen_however_much_they_match():
    picked, reasons, _ = run({}, {"a": 10, "b": 9}, bad={"a": 99.0}, exclude=("b",))
    assert picked == {"c"} and reasons == {NO_PREFIX}  # c matches nothing but is the only one left


def test_no_replica_is_flooded_or_starved_under_a_single_hot_prefix():
    """300 requests of one prefix, each held while 13 more arrive (14 in flight: more than two
    replicas take within the slack of an idle third, 2 x (0 + 4) = 8): the prefix spreads to all
    three, every replica stays within its limit, none is left idle while another is more than
    ``slack`` ahead."""
    rng, held, in_flight, holders = random.Random(1), [], {}, set()
    for _ in range(300):
        c = choose(R, 8, in_flight, lambda i: 10 if i in holders else 0, 10, Knobs(), rng)
        assert c is not None
        loads = [in_flight.get(r.instance, 0) for r in R]
        assert c.load <= min(loads) + 4  # the guard: never more than slack (4 at limit 8) ahead of the least loaded
        holders.add(c.route.instance)  # what the balancer does: the chosen replica now holds the prefix
        in_flight[c.route.instance] = c.load + 1
        held.append(c.route.instance)
        if len(held) > 13:  # the oldest finishes
            done = held.pop(0)
            in_flight[done] -= 1
        assert max(in_flight.values()) <= 8
    assert holders == {"a", "b", "c"}


def test_the_header_says_replica_matched_blocks_and_load():
    c = Choice(R[1], PREFIX, 7, 10, 2, 8)
    assert c.header() == "replica=b; matched=7/10 blocks; load=2/8; reason=prefix; index=text"


def test_knobs_are_checked():
    with pytest.raises(ValueError):
        Knobs(slack_min=-1)
    with pytest.raises(ValueError):
        Knobs(slack_frac=1.5)


# The balancer with the policy wired in (gateway/balance.py): what it remembers, and forgets.

def table(routes, **spec):
    from gateway.table import build

    return build(routes, {"m": {"max_concurrency": 8, **spec}}, 4)


def blocks(text: str):
    from gateway.prefix_index import block_hashes

    return block_hashes(text * 64, 16)  # 4 blocks of 16 characters for a 1-character text


async def test_the_balancer_sends_a_prefix_back_where_it_went_and_forgets_a_replica_that_left():
    from gateway.balance import Balancer, Prompt

    b = Balancer(queue_timeout_s=1, max_queue=10, bad_s=5, rng=random.Random(3))
    b.swap(table(R))
    first = Prompt(blocks("x"))
    r1, _ = await b.acquire("m", prompt=first)
    b.release(r1, "m")
    assert (first.choice.reason, first.choice.matched) == (NO_PREFIX, 0)
    for _ in range(5):  # idle replicas: the prefix goes back every time
        p = Prompt(blocks("x"))
        r, _ = await b.acquire("m", prompt=p)
        b.release(r, "m")
        assert r == r1 and (p.choice.reason, p.choice.matched, p.choice.blocks) == (PREFIX, 4, 4)
    b.swap(table([x for x in R if x != r1]))  # r1 drained: it leaves the table, and the index
    assert b.index.size(r1.instance) == 0
    b.swap(table(R))  # back (a new replica of the same name): it holds nothing
    p = Prompt(blocks("x"))
    await b.acquire("m", prompt=p)
    assert p.choice.reason == NO_PREFIX


async def test_a_spill_never_moves_a_prefix_home_not_even_by_its_copy():
    """Issue 39: a spill is a one-off. The guard sends a hot prefix's request off its home; the next
    one finds the copy that spill left matching as much as home, while home is still passed over for
    its load: that one is a spill too. Home stays, and the prefix goes back once home has room. (It
    had called the copy a match and moved the home, and the next spill moved it again.)"""
    from gateway.balance import Balancer, Prompt

    b = Balancer(queue_timeout_s=1, max_queue=10, bad_s=5, rng=random.Random(3))
    b.swap(table(R))  # 3 replicas, 8 at once: slack max(2, 4) = 4
    first = Prompt(blocks("h"))
    home, _ = await b.acquire("m", prompt=first)
    held = [home]
    for _ in range(4):  # home: 5 in flight, the others 0: 5 > 0 + 4, passed over from now on
        r, _ = await b.acquire("m", prompt=Prompt(blocks("h")))
        assert r == home
        held.append(r)
    spill = Prompt(blocks("h"))
    r1, _ = await b.acquire("m", prompt=spill)
    assert r1 != home and spill.choice.reason == IMBALANCE
    copy = Prompt(blocks("h"))
    r2, _ = await b.acquire("m", prompt=copy)  # the copy matches 4, as home does; home is still too busy
    assert r2 != home and copy.choice.matched == 4 and b.index.home(blocks("h")) == home.instance
    for r in held + [r1, r2]:
        b.release(r, "m")
    back = Prompt(blocks("h"))
    r3, _ = await b.acquire("m", prompt=back)  # idle again: home wins the tie of 4 matched blocks
    assert r3 == home and back.choice.matched == 4


async def test_a_copy_takes_a_hot_prefixs_request_while_home_lags_and_home_stays():
    """Rule 5 through the balancer: once every replica's pace is measured (12 ms a request ahead, 3 ms
    a block, fed as the relay feeds it), a spill's copy takes a request while home's wait exceeds its
    own by more than a tenth of the prefill it spares: 0.1 x 4 blocks x 3 ms = 1.2 ms, so one request
    more at home (12 ms) is enough here. Reason ``copy``; the home stays, and the prefix goes home when idle."""
    from gateway.balance import Balancer, Prompt

    b = Balancer(queue_timeout_s=1, max_queue=10, bad_s=5, rng=random.Random(3))
    b.swap(table(R))  # 3 replicas, 8 at once: slack 4
    for r in R:  # 16 first tokens each, varied in load and in blocks lacking: measured
        for k in range(16):
            b.pace.observe(r.instance, k % 4, (k * 3) % 5, 0.005 + 0.012 * (k % 4) + 0.003 * ((k * 3) % 5))
    home, _ = await b.acquire("m", prompt=Prompt(blocks("h")))
    held = [home]
    for _ in range(4):  # home 5 in flight: 5 > 0 + 4, the guard spills the next one
        held.append((await b.acquire("m", prompt=Prompt(blocks("h"))))[0])
    assert held == [home] * 5
    spill = Prompt(blocks("h"))
    r1, _ = await b.acquire("m", prompt=spill)  # home 5 x 12 = 60 ms > a full prefill elsewhere, 4 x 3 = 12 ms
    assert r1 != home and spill.choice.reason == IMBALANCE
    for r in held[1:4]:
        b.release(r, "m")  # home 2 in flight, the copy 1: within the guard; home 24 ms, the copy 12 ms
    copy = Prompt(blocks("h"))
    r2, _ = await b.acquire("m", prompt=copy)  # 24 - 12 = 12 ms > 1.2 ms: the copy
    assert (r2, copy.choice.reason, copy.choice.matched) == (r1, COPY, 4)
    assert b.index.home(blocks("h")) == home.instance
    for r in (held[0], held[4], r1, r2):
        b.release(r, "m")
    back = Prompt(blocks("h"))
    r3, _ = await b.acquire("m", prompt=back)  # idle: equal costs, home
    assert (r3, back.choice.reason) == (home, PREFIX)


async def test_a_replica_at_a_new_address_is_a_new_cache():
    from gateway.balance import Balancer, Prompt

    b = Balancer(queue_timeout_s=1, max_queue=10, bad_s=5)
    b.swap(table(R[:1]))
    await b.acquire("m", prompt=Prompt(blocks("x")))
    assert b.index.size("a") == 4
    b.swap(table([Route("a", "m", "127.0.0.1", 2)]))  # restarted on another port
    assert b.index.size("a") == 0


async def test_a_deployment_pinned_to_least_outstanding_remembers_nothing():
    from gateway.balance import Balancer, Prompt

    b = Balancer(queue_timeout_s=1, max_queue=10, bad_s=5)
    b.swap(table(R, routing="least-outstanding"))
    p = Prompt(blocks("x"))
    await b.acquire("m", prompt=p)
    assert p.choice.reason == "least-outstanding" and b.index.total == 0
    b2 = Balancer(queue_timeout_s=1, max_queue=10, bad_s=5, routing="least-outstanding")
    b2.swap(table(R, routing="cache-aware"))  # the spec wins over the gateway's default
    await b2.acquire("m", prompt=Prompt(blocks("x")))
    assert b2.index.total == 4


async def test_a_queued_request_is_routed_by_its_prompt_when_slots_free():
    import asyncio

    from gateway.balance import Balancer, Prompt

    b = Balancer(queue_timeout_s=5, max_queue=10, bad_s=5)
    b.swap(table(R[:2], max_concurrency=1))
    ra, _ = await b.acquire("m", prompt=Prompt(blocks("x")))
    rb, _ = await b.acquire("m", prompt=Prompt(blocks("y")))
    p = Prompt(blocks("y"))
    waiting = asyncio.create_task(b.acquire("m", prompt=p))
    await asyncio.sleep(0.01)
    b.release(ra, "m")  # only the replica holding x is free: the waiter is not held back for its own
    assert (await waiting)[0] == ra and p.choice.reason == NO_PREFIX


def test_the_spec_takes_a_routing_and_nothing_else():
    from pydantic import ValidationError

    from scheduler.spec import ModelSpec, Routing

    base = {"name": "m", "source": {"local_path": "/m"}, "backend": "custom", "run_command": "x"}
    assert ModelSpec.model_validate(base).routing is None
    assert "routing" not in ModelSpec.model_validate(base).model_dump(mode="json", exclude_none=True)
    assert ModelSpec.model_validate({**base, "routing": "least-outstanding"}).routing is Routing.LEAST_OUTSTANDING
    with pytest.raises(ValidationError):
        ModelSpec.model_validate({**base, "routing": "round-robin"})


async def test_the_metrics_show_each_replicas_index_size_and_where_it_came_from():
    from gateway.balance import Balancer, Prompt
    from gateway.metrics import Metrics
    from gateway.prefix_index import PrefixIndex

    b = Balancer(queue_timeout_s=1, max_queue=10, bad_s=5, index=PrefixIndex(capacity=100))
    b.swap(table(R))
    r, _ = await b.acquire("m", prompt=Prompt(blocks("x")))  # 4 blocks sent to r
    b.index.set_capacity("a", 64)  # a's engine reported its cache
    b.index.set_capacity("b", 40, reported=False)  # b's answers showed about 40 blocks
    m = Metrics()
    m.index_sizes(b.index_rows())

    def value(name, **labels):
        return m.registry.get_sample_value(name, labels)

    sizes = {i: ("reported", 64) if i == "a" else ("learned", 40) if i == "b" else ("default", 100) for i in "abc"}
    for i, (source, cap) in sizes.items():
        assert value("gpuflow_gateway_prefix_index_capacity_blocks", model="m", replica=i, source=source) == cap
        assert value("gpuflow_gateway_prefix_index_held_blocks", model="m", replica=i) == (4 if i == r.instance else 0)
    b.swap(table(R[:2]))  # c leaves the table: and the series
    m.index_sizes(b.index_rows())
    assert value("gpuflow_gateway_prefix_index_capacity_blocks", model="m", replica="c", source="default") is None
    b.swap(table(R, routing="least-outstanding"))  # no index kept: no series
    m.index_sizes(b.index_rows())
    assert value("gpuflow_gateway_prefix_index_held_blocks", model="m", replica="a") is None


def test_skewed_customers_are_shared_out_by_the_room_their_prefixes_take():
    """Issue 39's hot-prefix workload, as the index sees it: 16 customers of Zipf(1.2) popularity (the
    first sends 30% of the requests), each prompt a 24-block prefix and a 2-block question, 4 replicas
    of 128 blocks (4 prefixes each fit, 5 do not). By the strict least held, the hot customer's
    replica filled with questions first, every other replica looked emptier by a block or two, and
    13 of these 20 draws put a fifth prefix on one replica. Read to the new prompt's own size (a
    replica within 26 blocks of the least counts as the least, then the turn), every draw puts 4 on each."""
    import collections

    from gateway.prefix_index import PrefixIndex, block_hashes

    reps = [Route(i, "m", "127.0.0.1", 1) for i in ("a", "b", "c", "d")]
    weights = [1 / (c + 1) ** 1.2 for c in range(16)]
    for seed in range(20):
        idx, rng, first = PrefixIndex(capacity=128), random.Random(seed), {}
        for n in range(400):
            c = rng.choices(range(16), weights)[0]
            blocks = block_hashes(f"customer {c} " + "y" * 3060 + f" q{n} " + "z" * 250, 128)  # 24 + 2 blocks
            home = idx.home(blocks)
            ch = choose(reps, 16, {}, lambda i: idx.matched(i, blocks), len(blocks), Knobs(), rng,
                        held=idx.size, home=home, new_turn=idx.new_turn)
            if ch.reason == NO_PREFIX and home is None:
                idx.placed_new(ch.route.instance)
            idx.insert(ch.route.instance, blocks)
            first.setdefault(c, ch.route.instance)
        assert sorted(collections.Counter(first.values()).values()) == [4, 4, 4, 4], seed


def test_the_room_an_index_reads_is_its_free_blocks_where_a_caches_size_is_known():
    from gateway.prefix_index import CAPACITY, PrefixIndex

    guess = PrefixIndex()  # the default guess (16,384 blocks): held blocks tell how busy, not how full
    guess.insert("a", tuple(range(30)))
    assert guess.size("a") == 30 and guess.fill("a") is None and guess.fill("b") is None
    guess.set_capacity("a", 64, reported=False)  # learned from its answers: known; 30 held of 64
    guess.set_capacity("b", 128)  # reported by its engine: known; none held
    assert (guess.fill("a"), guess.fill("b")) == (30 - 64, -128)  # b has more room, though a is smaller
    assert PrefixIndex(capacity=256).fill("a") == -256  # --prefix-cache-blocks given: the operator sized it
    assert PrefixIndex(capacity=CAPACITY, sized=True).fill("a") == -CAPACITY


def test_by_free_room_a_small_cache_is_not_handed_every_new_prefix():
    # learned sizes of 40 and 400 blocks, each LRU full: by blocks held the small one had the most room and took
    # every unique prompt (the bench's no-prefix phase: p90 1.3 s); by free room both are full, and they take turns
    from gateway.balance import Balancer, Prompt

    b = Balancer(queue_timeout_s=1, max_queue=10, bad_s=5, rng=random.Random(1))
    b.swap(table(R[:2]))
    for r, cap in zip(R[:2], (40, 400)):
        b.index.set_capacity(r.instance, cap, reported=False)
        b.index.insert(r.instance, tuple(range(cap * 7, cap * 8)))  # full
    got = []
    for n in range(8):
        p = Prompt(blocks(f"unique {n}"))
        r = b._choose("m", frozenset(), 0.0, p)
        b.release(r, "m")
        got.append(r.instance)
    assert sorted(got) == ["a"] * 4 + ["b"] * 4, got
