"""The cache-aware policy (gateway/cache_aware.py) as tables: matched blocks against in-flight
requests, the imbalance guard, and what is never done (flood a replica past its limit, pass over
an idle one for a busy one more than ``slack`` ahead). Comments show the arithmetic."""

from __future__ import annotations

import random

import pytest

from store.serving import Route
from gateway.balance import pick
from gateway.cache_aware import IMBALANCE, NO_PREFIX, PREFIX, Choice, Knobs, choose

R = [Route(i, "m", "127.0.0.1", 1) for i in ("a", "b", "c")]


def run(in_flight, matched, blocks=10, limit=8, knobs=Knobs(), bad=None, exclude=()):
    """Every replica the rule may pick over 40 draws, and the reasons it gave."""
    got = {choose(R, limit, in_flight, lambda i: matched.get(i, 0), blocks, knobs, random.Random(s), bad or {}, 10.0,
                  frozenset(exclude)) for s in range(40)}
    return {c.route.instance for c in got if c}, {c.reason for c in got if c}, None in got


@pytest.mark.parametrize("in_flight,matched,limit,expect,reason", [
    # slack = max(2, ceil(8 * 0.25)) = 2 for limit 8 (Knobs' defaults)
    ({}, {"b": 7}, 8, {"b"}, PREFIX),  # idle: the replica holding 7 of 10 blocks
    ({"b": 2}, {"b": 7}, 8, {"b"}, PREFIX),  # b at 2, least loaded 0: 2 <= 0 + 2, still a candidate
    ({"b": 3}, {"b": 7}, 8, {"a", "c"}, IMBALANCE),  # 3 > 0 + 2: b is left out, a or c (0 each) take it
    ({"a": 1, "b": 3, "c": 2}, {"b": 7}, 8, {"b"}, PREFIX),  # least loaded is 1: 3 <= 1 + 2
    ({"a": 2, "b": 5, "c": 4}, {"b": 7, "c": 3}, 8, {"c"}, IMBALANCE),  # b 5 > 2 + 2; c (4 <= 4) matches 3 > a's 0
    # a and b hold 4 blocks each, c none and idle: 1 <= 0 + 2, so a and b keep it (equal: at random)
    ({"a": 1, "b": 1}, {"a": 4, "b": 4}, 8, {"a", "b"}, PREFIX),
    ({"a": 3, "b": 3}, {"a": 4, "b": 4}, 8, {"c"}, IMBALANCE),  # 3 > 0 + 2: both out, c takes it (and caches it)
    ({"a": 2, "b": 1}, {"a": 4, "b": 4}, 8, {"b"}, PREFIX),  # equal matches: the fewer in flight
    ({"b": 8}, {"b": 7}, 8, {"a", "c"}, NO_PREFIX),  # b at its limit 8: not eligible; nobody else matches
    # limit 64: slack = max(2, ceil(64 * 0.25)) = 16; least loaded a at 1: b (50) and c (40) > 1 + 16
    ({"a": 1, "b": 50, "c": 40}, {"b": 9, "c": 9}, 64, {"a"}, IMBALANCE),
    ({"a": 1, "b": 50, "c": 17}, {"b": 9, "c": 9}, 64, {"c"}, PREFIX),  # c: 17 <= 1 + 16
])
def test_matched_blocks_against_load(in_flight, matched, limit, expect, reason):
    picked, reasons, none = run(in_flight, matched, limit=limit)
    assert picked == expect and reasons == {reason} and not none


@pytest.mark.parametrize("knobs,in_flight,expect", [
    (Knobs(slack_min=0, slack_frac=0), {"b": 1}, {"a", "c"}),  # no slack: any gap sends it to the least loaded
    (Knobs(slack_min=5, slack_frac=0), {"b": 5}, {"b"}),  # 5 <= 0 + 5
    (Knobs(slack_min=0, slack_frac=0.5), {"b": 4}, {"b"}),  # ceil(8 * 0.5) = 4: 4 <= 4
    (Knobs(slack_min=0, slack_frac=0.5), {"b": 5}, {"a", "c"}),  # 5 > 4
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


def test_bad_and_excluded_replicas_are_never_chosen_however_much_they_match():
    picked, reasons, _ = run({}, {"a": 10, "b": 9}, bad={"a": 99.0}, exclude=("b",))
    assert picked == {"c"} and reasons == {NO_PREFIX}  # c matches nothing but is the only one left


def test_no_replica_is_flooded_or_starved_under_a_single_hot_prefix():
    """300 requests of one prefix, each held while 9 more arrive (about 3 in flight per
    replica): the prefix spreads, every replica stays within its limit, none is left idle while
    another is more than ``slack`` ahead."""
    rng, held, in_flight, holders = random.Random(1), [], {}, set()
    for _ in range(300):
        c = choose(R, 8, in_flight, lambda i: 10 if i in holders else 0, 10, Knobs(), rng)
        assert c is not None
        loads = [in_flight.get(r.instance, 0) for r in R]
        assert c.load <= min(loads) + 2  # the guard: never more than slack ahead of the least loaded
        holders.add(c.route.instance)  # what the balancer does: the chosen replica now holds the prefix
        in_flight[c.route.instance] = c.load + 1
        held.append(c.route.instance)
        if len(held) > 9:  # the oldest finishes
            done = held.pop(0)
            in_flight[done] -= 1
        assert max(in_flight.values()) <= 8
    assert holders == {"a", "b", "c"}


def test_the_header_says_replica_matched_blocks_and_load():
    c = Choice(R[1], PREFIX, 7, 10, 2, 8)
    assert c.header() == "replica=b; matched=7/10 blocks; load=2/8; reason=prefix"


def test_knobs_are_checked():
    with pytest.raises(ValueError):
        Knobs(slack_min=-1)
    with pytest.raises(ValueError):
        Knobs(slack_frac=1.5)
