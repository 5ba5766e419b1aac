"""The guard that weighs the cost of a move (gateway/cache_aware.py, rule 3b), as tables: when
the request-gap guard would move a request off the replica holding its prefix, it moves only if
the wait there costs more than the prefill it would repeat elsewhere, both measured per replica
(``Pace``); ties go home; unmeasured, the guard alone. Comments show the arithmetic."""

from __future__ import annotations

import random

import pytest

from store.serving import Route
from gateway.cache_aware import COPY, IMBALANCE, NO_PREFIX, PREFIX, Knobs, Pace, choose, cost_s, solve3

R = [Route(i, "m", "127.0.0.1", 1) for i in ("a", "b", "c")]
FAST = (0.012, 0.003)  # 12 ms a request ahead, 3 ms a block: the routing bench's stand-in, its prompts mostly cached


@pytest.mark.parametrize("load,matched,blocks,pace,expect", [
    (0, 48, 48, FAST, 0.0),  # idle, all held: nothing to wait for
    (5, 48, 48, FAST, 0.060),  # 5 x 0.012
    (0, 0, 48, FAST, 0.144),  # 48 x 0.003: a full prefill
    (13, 48, 52, FAST, 0.168),  # 13 x 0.012 + 4 x 0.003 = 0.156 + 0.012
    (2, 10, 48, (0.1, 0.003), 0.314),  # 2 x 0.1 + 38 x 0.003 = 0.2 + 0.114
])
def test_the_cost_in_seconds(load, matched, blocks, pace, expect):
    assert cost_s(load, matched, blocks, pace) == pytest.approx(expect)


def run(in_flight, matched, paces, blocks=48, limit=16, home=None, knobs=Knobs()):
    """Every replica the rule picks over 40 draws, and its reasons."""
    got = {choose(R, limit, in_flight, lambda i: matched.get(i, 0), blocks, knobs, random.Random(s),
                  home=home, pace=paces.get) for s in range(40)}
    return {c.route.instance for c in got}, {c.reason for c in got}


ALL_FAST = {"a": FAST, "b": FAST, "c": FAST}
SLOW_PREFILL = {"a": (0.012, 0.03), "b": (0.012, 0.03), "c": (0.012, 0.03)}


@pytest.mark.parametrize("in_flight,matched,paces,limit,expect,reason", [
    # b holds all 48 blocks; a and c none. Limit 16: the request-gap guard (slack 8) proposes a move when b
    # is more than 8 ahead; the cost keeps it on b unless b's wait costs more than a full prefill, 48 x 0.003 = 0.144
    ({"b": 5}, {"b": 48}, ALL_FAST, 16, {"b"}, PREFIX),  # 5 <= 0 + 8: the guard keeps it, nothing to weigh
    ({"b": 11}, {"b": 48}, ALL_FAST, 16, {"b"}, PREFIX),  # 11 > 8, but 11 x 0.012 = 0.132 < 0.144: it waits on b
    ({"b": 13}, {"b": 48}, ALL_FAST, 16, {"a", "c"}, IMBALANCE),  # 0.156 > 0.144: moved, to a or c (0 each)
    ({"a": 3, "b": 13, "c": 3}, {"b": 48}, ALL_FAST, 16, {"b"}, PREFIX),  # 13 > 3 + 8; a, c: 0.036 + 0.144 > 0.156
    # a slow replica: b's requests take 80 ms each ahead (a stall): 9 x 0.08 = 0.72 > 0.144
    ({"b": 9}, {"b": 48}, {"a": FAST, "b": (0.08, 0.003), "c": FAST}, 16, {"a", "c"}, IMBALANCE),
    ({"b": 9}, {"b": 48}, ALL_FAST, 16, {"b"}, PREFIX),  # at 12 ms: 0.108 < 0.144, it stays
    # a partial copy on c (40 of 48): c costs 1 x 0.012 + 8 x 0.003 = 0.036 < b's 10 x 0.012 = 0.120
    ({"b": 10, "c": 1}, {"b": 48, "c": 40}, ALL_FAST, 16, {"c"}, IMBALANCE),
    ({"b": 4, "c": 1}, {"b": 48, "c": 40}, ALL_FAST, 16, {"b"}, PREFIX),  # 4 <= 1 + 8: the guard keeps b
    # prefill dearer (30 ms a block): a move costs 48 x 0.03 = 1.44, as much as 120 requests ahead at 0.012
    ({"b": 70}, {"b": 48}, SLOW_PREFILL, 128, {"b"}, PREFIX),  # 70 > 0 + 64, but 0.84 < 1.44
    ({"b": 120}, {"b": 48}, SLOW_PREFILL, 128, {"b"}, PREFIX),  # 1.44 = 1.44: a tie, the most matched
    ({"b": 121}, {"b": 48}, SLOW_PREFILL, 128, {"a", "c"}, IMBALANCE),  # 1.452 > 1.44
])
def test_a_move_is_weighed_against_the_prefill_it_repeats(in_flight, matched, paces, limit, expect, reason):
    assert run(in_flight, matched, paces, limit=limit) == (expect, {reason})


@pytest.mark.parametrize("in_flight,matched,paces,expect,reason", [
    # gpuflow gateway --no-route-cost: the guard alone, measured or not (slack 8 at limit 16)
    ({"b": 11}, {"b": 48}, ALL_FAST, {"a", "c"}, IMBALANCE),  # 11 > 0 + 8: moved, though 0.132 < 0.144 would keep it
    # 12 > 8: moved, where the cost kept it (12 x 0.012 = 0.144 < 48 x 0.03 = 1.44)
    ({"b": 12}, {"b": 48}, SLOW_PREFILL, {"a", "c"}, IMBALANCE),
    ({"b": 8}, {"b": 48}, ALL_FAST, {"b"}, PREFIX),  # 8 <= 0 + 8: within the guard
])
def test_without_the_cost_the_guard_decides_alone(in_flight, matched, paces, expect, reason):
    assert run(in_flight, matched, paces, limit=16, knobs=Knobs(cost=False)) == (expect, {reason})


@pytest.mark.parametrize("in_flight,matched,home,expect", [
    # a spill left a full copy on c; b is the prefix's home (a spill does not move it)
    ({"b": 2, "c": 2}, {"b": 48, "c": 48}, "b", {"b"}),  # equal cost (0.024 each): home
    ({"b": 2, "c": 2}, {"b": 48, "c": 48}, None, {"b", "c"}),  # no home: the most matched tie, at random
    ({"b": 3, "c": 2}, {"b": 48, "c": 48}, "b", {"b"}),  # 3 <= 2 + 8: the guard keeps home, nothing to weigh
    ({"b": 11, "c": 2}, {"b": 48, "c": 48}, "b", {"c"}),  # 11 > 2 + 8: c, as cheap to prefill, waits less
    ({"b": 2, "c": 2}, {"b": 48, "c": 48}, "a", {"b", "c"}),  # a home that costs more (0.144) is no tie
    # every replica holds it (a shared header, or a hot prefix spread over all): no home, the cost alone
    ({"a": 2, "b": 2, "c": 2}, {"a": 48, "b": 48, "c": 48}, "b", {"a", "b", "c"}),
])
def test_ties_go_home(in_flight, matched, home, expect):
    assert run(in_flight, matched, ALL_FAST, home=home)[0] == expect


@pytest.mark.parametrize("in_flight,matched,paces,knobs,expect", [
    # rule 5: b is home, c holds a spill's full copy (48 blocks), a none (4 in flight: the guard's ceiling is
    # 2 + 8 = 10, so b stays a candidate). Measured at 12 ms a request ahead, 3 ms a block, c takes the request
    # when b's wait exceeds c's by more than 0.1 x 48 x 0.003 = 0.0144 s: two requests ahead, not one
    ({"a": 4, "b": 3, "c": 2}, {"b": 48, "c": 48}, ALL_FAST, Knobs(), {"b"}),  # 1 x 0.012 = 0.012 < 0.0144: home
    ({"a": 4, "b": 4, "c": 2}, {"b": 48, "c": 48}, ALL_FAST, Knobs(), {"c"}),  # 0.024 > 0.0144: the copy
    ({"a": 4, "b": 4, "c": 3}, {"b": 48, "c": 48}, ALL_FAST, Knobs(), {"b"}),  # 0.012 again: home
    ({"a": 4, "b": 9, "c": 2}, {"b": 48, "c": 48}, {}, Knobs(), {"b"}),  # unmeasured: home
    ({"a": 4, "b": 9, "c": 2}, {"b": 48, "c": 48}, ALL_FAST, Knobs(cost=False), {"b"}),  # the cost off: home
    ({"a": 4, "b": 3, "c": 2}, {"b": 48, "c": 48}, ALL_FAST, Knobs(copy_margin=0), {"c"}),  # no margin: 0.012 > 0
    # half the prefill (0.5 x 48 x 0.003 = 0.072 s): 6 x 0.012 = 0.072, not more, home; 7 x 0.012 = 0.084, the copy
    ({"a": 4, "b": 8, "c": 2}, {"b": 48, "c": 48}, ALL_FAST, Knobs(copy_margin=0.5), {"b"}),
    ({"a": 4, "b": 9, "c": 2}, {"b": 48, "c": 48}, ALL_FAST, Knobs(copy_margin=0.5), {"c"}),
    # a partial copy (40 of 48) is not as much: it would repeat 8 blocks' prefill (rule 3b weighs that, not rule 5)
    ({"a": 4, "b": 9, "c": 2}, {"b": 48, "c": 40}, ALL_FAST, Knobs(), {"b"}),
    # the copy on a (1 ahead), c's partial: 0.012 x (9 - 1) = 0.096 > 0.0144 (ceiling 1 + 8 = 9: b a candidate)
    ({"a": 1, "b": 9, "c": 2}, {"a": 48, "b": 48, "c": 40}, ALL_FAST, Knobs(), {"a"}),
    # a slower copy: c's requests ahead cost 30 ms: 4 x 0.012 = 0.048 against 2 x 0.03 = 0.06, home is cheaper
    ({"a": 4, "b": 4, "c": 2}, {"b": 48, "c": 48}, {"a": FAST, "b": FAST, "c": (0.03, 0.003)}, Knobs(), {"b"}),
])
def test_a_copy_shares_a_hot_prefixs_load(in_flight, matched, paces, knobs, expect):
    got, reasons = run(in_flight, matched, paces, home="b", knobs=knobs)
    assert (got, reasons) == (expect, {PREFIX if expect == {"b"} else COPY})  # home's reason, or the copy's


@pytest.mark.parametrize("in_flight,matched,home,expect", [
    # unmeasured: the request-gap guard (slack 4 at limit 8); among the most matched, home before load
    ({"b": 4, "c": 0}, {"b": 48, "c": 48}, "b", {"b"}),  # 4 <= 0 + 4: within the guard, home
    ({"b": 4, "c": 0}, {"b": 48, "c": 48}, None, {"c"}),  # no home: the fewer in flight, as before
    ({"b": 5, "c": 0}, {"b": 48, "c": 48}, "b", {"c"}),  # 5 > 0 + 4: the guard leaves home out
    # a 3-block header every replica holds: not a home, the fewest in flight (a new customer is shared out)
    ({"a": 1, "b": 2, "c": 1}, {"a": 3, "b": 3, "c": 3}, "b", {"a", "c"}),
    ({"a": 1, "b": 4, "c": 0}, {"a": 48, "b": 48, "c": 48}, "b", {"c"}),  # a hot prefix spread over all three
])
def test_unmeasured_ties_go_home_within_the_guard(in_flight, matched, home, expect):
    assert run(in_flight, matched, {}, limit=8, home=home)[0] == expect


@pytest.mark.parametrize("paces,in_flight,expect", [
    ({}, {"b": 5}, {"a", "c"}),  # nothing measured: the request-gap guard, 5 > 0 + 4 at limit 8
    ({"b": FAST, "c": FAST}, {"b": 5}, {"a", "c"}),  # a unmeasured: every replica must be, else the guard
    (ALL_FAST, {"b": 5}, {"b"}),  # all measured: 5 x 0.012 = 0.060 < 0.144, it stays
])
def test_the_cost_decides_only_when_every_eligible_replica_is_measured(paces, in_flight, expect):
    assert run(in_flight, {"b": 48}, paces, limit=8)[0] == expect


def test_without_a_match_the_cost_is_not_used():
    """Nobody holds the prefix: a new prefix's placement (room, turn) is the guard's, unchanged."""
    held = {"a": 90, "b": 10, "c": 70}  # a and c hold more than b plus the prompt's 48 blocks
    got = {choose(R, 8, {"b": 3}, lambda i: 0, 48, Knobs(), random.Random(s), held=held.get,
                  pace=ALL_FAST.get).route.instance for s in range(40)}
    assert got == {"b"}  # most room, though busier (3 <= 0 + 4); the cost would have said a or c


def test_the_limit_still_bounds_a_replica():
    c = choose(R, 8, {"b": 8}, lambda i: 48 if i == "b" else 0, 48, Knobs(), random.Random(1),
               pace=ALL_FAST.get)
    assert c.route.instance != "b" and c.reason == NO_PREFIX  # b at its limit is not eligible


@pytest.mark.parametrize("a,b,expect", [
    (((1, 0, 0), (0, 2, 0), (0, 0, 4)), (1, 2, 4), (1, 1, 1)),
    (((2, 1, 0), (1, 2, 1), (0, 1, 2)), (3, 4, 3), (1, 1, 1)),  # 2+1 = 3, 1+2+1 = 4, 1+2 = 3
    (((4, 8, 16), (8, 16, 32), (16, 32, 64)), (1, 2, 3), None),  # rank 1: singular
])
def test_solve3(a, b, expect):
    got = solve3(a, b)
    assert got == expect if expect is None else got == pytest.approx(expect)


def feed(p: Pace, samples, inst="b"):
    for x, u, y in samples:
        p.observe(inst, x, u, y)


def synthetic(n, c=0.005, a=0.012, b=0.003, seed=0):
    """First-token times of a replica that spends c + a per request ahead + b per uncached block."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        x, u = rng.randrange(0, 12), rng.choice((4, 4, 4, 52))  # a hit (4 question blocks) or a full miss
        out.append((x, u, c + a * x + b * u))
    return out


def test_pace_measures_a_request_ahead_and_a_block():
    p = Pace()
    feed(p, synthetic(15))
    assert p.of("b") is None  # 15 < 16 samples
    feed(p, synthetic(1, seed=1))
    assert p.of("b") == pytest.approx((0.012, 0.003))
    assert p.of("a") is None  # measured per replica


def test_pace_follows_a_replica_that_slows():
    """Half life 64: after 128 samples at 80 ms a request ahead, the old 12 ms weigh a quarter as
    much (1/4 of their weight left; more of them): the fit is closer to 80 than to 12."""
    p = Pace()
    feed(p, synthetic(200))
    feed(p, synthetic(128, a=0.08, seed=2))
    ahead, block = p.of("b")
    assert 0.05 < ahead < 0.08 and block == pytest.approx(0.003, rel=0.2)


@pytest.mark.parametrize("samples", [
    [(x % 5, 4, 0.01 + 0.01 * (x % 5)) for x in range(40)],  # every request a hit: a block's cost unknown
    [(0, u, 0.01 + 0.003 * u) for u in (4, 52) * 20],  # never anything ahead: a request's cost unknown
    [(x, 4 * x, 0.01 * x) for x in range(40)],  # ahead and uncached moved together: cannot be told apart
])
def test_pace_stays_unmeasured_without_variation(samples):
    p = Pace()
    feed(p, samples)
    assert p.of("b") is None


def test_pace_forgets_a_replica():
    p = Pace()
    feed(p, synthetic(20))
    p.forget("b")
    assert p.of("b") is None
    feed(p, synthetic(15))
    assert p.of("b") is None  # counted anew


def test_pace_checks_its_knobs():
    with pytest.raises(ValueError):
        Pace(half_life=0)
    with pytest.raises(ValueError):
        Pace(min_samples=2)
