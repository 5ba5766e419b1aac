"""Limits held across gateways (gateway/limit_shares.py: each gateway's share from every live
gateway's demand) and per API key (gateway/tenant_limits.py), as tables whose comments show the
arithmetic; then two or three gateways' Limits run side by side on simulated time, exchanging
their demand every refresh as the store would (store/gateway_demand.py), and held to the README's
bound."""

from __future__ import annotations

import json
import math

import pytest

from gateway import errors
from gateway.limit_shares import allot, fraction
from gateway.tenant_limits import KEY, MAX_CONCURRENT as MC, REQUESTS_PER_S as RPS, TENANT, TOKENS_PER_MIN as TPM
from gateway.tenant_limits import Limits, Rule, key_rule
from store.keys import KeyInfo


# weight(g) = demand(g) + 0.1 * mean demand + 0.001; share(me) = weight(me) / sum of weights
@pytest.mark.parametrize("me,demands,want", [
    ("a", {}, 1.0),  # no rows read yet: alone
    ("a", {"a": 5.0}, 1.0),  # the only live gateway holds the whole limit
    ("a", {"a": 0.0, "b": 0.0}, 0.5),  # no demand anywhere: 0.001 each, even
    ("a", {"a": 9.0, "b": 1.0}, 9.501 / 11.002),  # mean 5, eps 0.501: 9.501 / (9.501 + 1.501) = 0.8636
    ("b", {"a": 9.0, "b": 1.0}, 1.501 / 11.002),  # the two add up to 1
    ("a", {"a": 10.0, "b": 0.0}, 10.501 / 11.002),  # all the traffic here: 0.9545; b keeps 0.0455
    ("c", {"a": 4.0, "b": 4.0, "c": 0.0}, (0.1 * 8 / 3 + 0.001) / (8 + 3 * (0.1 * 8 / 3 + 0.001))),  # 0.0304
    ("a", {"a": -3.0, "b": 0.0}, 0.5),  # a negative demand counts as 0
])
def test_fraction(me, demands, want):
    assert fraction(me, demands) == pytest.approx(want)


# largest remainder of limit * share, ties to the smaller gateway id; the parts add up to the limit
@pytest.mark.parametrize("limit,demands,want", [
    (4, {"a": 0.0, "b": 0.0}, {"a": 2, "b": 2}),  # 2 + 2
    (3, {"a": 0.0, "b": 0.0}, {"a": 2, "b": 1}),  # 1.5 + 1.5: floors 1 + 1, the one left to a (tie, id)
    (1, {"a": 0.0, "b": 0.0, "c": 0.0}, {"a": 1, "b": 0, "c": 0}),  # more gateways than the limit
    (10, {"a": 9.0, "b": 1.0}, {"a": 9, "b": 1}),  # 8.636 + 1.364: floors 8 + 1, a's .636 is larger
    (5, {"a": 2.0, "b": 2.0, "c": 6.0}, {"a": 1, "b": 1, "c": 3}),  # 1.04 + 1.04 + 2.92: c's .92 first
])
def test_allot(limit, demands, want):
    got = {g: allot(limit, g, demands) for g in demands}
    assert got == want and sum(got.values()) == limit


# Rows no share can be made of (another gateway's numbers, read from the store): each weighs the
# same rather than one taking all, none, or NaN
@pytest.mark.parametrize("demands", [
    {"a": 1e308, "b": 1e308},  # weights sum to infinity: before, NaN shares and a bucket admitting all
    {"a": math.inf, "b": 1.0},  # an infinity
    {"a": math.nan, "b": 1.0},  # NaN
])
def test_shares_of_rows_that_overflow_are_even(demands):
    assert fraction("a", demands) + fraction("b", demands) == pytest.approx(1.0)
    assert 0.0 <= fraction("b", demands) <= 1.0
    assert allot(4, "a", demands) + allot(4, "b", demands) == 4


# store/gateway_demand.py's parse: what it reads of a row, clipped at MAX_DEMAND (1e6)
@pytest.mark.parametrize("row,want", [
    ({"tenant:t": 3.5}, {"tenant:t": 3.5}),
    ({"tenant:t": 10 ** 400}, {"tenant:t": 1e6}),  # an int too large for a float: before, OverflowError at every refresh
    ({"tenant:t": 1.7e308}, {"tenant:t": 1e6}),  # clipped: no sum of rows overflows
    ({"tenant:t": -1, "key:k": True, "key:j": "9"}, {}),  # negative, a bool, a string: left out
])
def test_parse_clips_what_another_gateway_wrote(row, want):
    from store.gateway_demand import parse
    assert parse(json.dumps(row)) == want


def test_a_bucket_that_does_not_refill_says_the_cap_and_does_not_divide_by_zero():
    from gateway.tenant_limits import Bucket, wait_s
    assert wait_s(Bucket(rate=0.0, burst=1.0, tokens=0.0, at=0.0)) == 600.0  # before: ZeroDivisionError
    assert wait_s(Bucket(rate=2.0, burst=1.0, tokens=0.5, at=0.0)) == 0.25  # (1 - 0.5) / 2
    assert wait_s(Bucket(rate=1e-9, burst=1.0, tokens=0.0, at=0.0)) == 600.0  # a sliver of a share: the cap


def test_one_gateway_reporting_the_most_leaves_the_others_their_floor():
    # clipped at 1e6, the other's weight is 0.1 x mean (5e5) = 5e4: 1/22 of the limit, never 0
    lim = Limits({"t": Rule(requests_per_s=1.0)}, now=0.0, me="me")
    lim.admit("t", 0.0)
    lim.set_shares({"me": {}, "b": {"tenant:t": 1e6}}, 0.0)
    assert lim.share(TENANT, "t") == pytest.approx(1 / 22, rel=1e-3)


def test_an_answer_claiming_billions_of_tokens_costs_at_most_ten_minutes():
    # 600 a minute: the bucket holds 600, refills 10 a second; the debt stops at -10 x 600 = -6000
    lim = Limits({"t": Rule(tokens_per_min=600)}, now=0.0)
    assert lim.admit("t", 0.0) is None
    lim.spend("t", "", 2 ** 32)  # before: 600 - 4.3e9, some 7,000 hours refused
    got = lim.admit("t", 1.0)  # -6000 + 10 = -5990: (1 + 5990) / 10 = 599.1 s
    assert got.retry_after_s == pytest.approx(599.1)
    assert lim.admit("t", 601.0) is None  # -6000 + 6010 = 10 > 0


def test_allot_alone_is_the_limit():
    assert allot(7, "a", {}) == 7 and allot(7, "a", {"a": 3.0}) == 7


# A key's own limits are checked before its tenant's; a refusal names the limit and the scope.
KEYED = Rule(requests_per_s=1.0)  # key k1: 1 a second (burst 1); tenant t: 10 a second (burst 10)


@pytest.mark.parametrize("steps", [
    pytest.param([(0.0, "k1", None), (0.0, "k1", (KEY, RPS)),  # the key's 1-token bucket is empty
                  (0.0, "k2", None), (0.0, "", None),  # its tenant's other key, and no key: the tenant has room
                  (1.0, "k1", None)], id="key-requests_per_s"),
    pytest.param([(0.0, "k2", None)] * 10 + [(0.0, "k1", (TENANT, RPS))], id="tenant-bucket-spent-by-other-key"),
])
def test_key_then_tenant(steps):
    lim = Limits({"t": Rule(requests_per_s=10.0)}, now=0.0)
    for now, key, want in steps:
        got = lim.admit("t", now, key, KEYED if key == "k1" else None)
        assert (None if got is None else (got.scope, got.reason)) == want, (now, key, got)


def test_tokens_per_min_is_spent_when_the_answer_ends():
    # 600 tokens a minute = 10 a second, the bucket holds 600
    lim = Limits({"t": Rule(tokens_per_min=600)}, now=0.0)
    assert lim.admit("t", 0.0) is None
    lim.spend("t", "", 1000)  # one answer of 1000 tokens: 600 - 1000 = -400
    got = lim.admit("t", 1.0)  # 10 refilled: -390; one token needs (1 + 390) / 10 = 39.1 s
    assert (got.reason, got.scope) == (TPM, TENANT) and got.retry_after_s == pytest.approx(39.1)
    assert lim.admit("t", 41.0) is None  # -400 + 41 * 10 = 10 > 0
    lim.done("t")


def test_key_rule_of_a_key_record():
    k = KeyInfo("abc", "t", "", None, None, requests_per_s=2.0, max_concurrent=3)
    assert key_rule(k) == Rule(0, 2.0, 3, None)
    assert key_rule(KeyInfo("abc", "t", "", None, None)) is None and key_rule(None) is None


def test_a_429_names_the_limit_and_the_scope():
    lim = Limits({}, now=0.0)
    assert lim.admit("t", 0.0, "k1", Rule(max_concurrent=1)) is None
    refused = lim.admit("t", 0.0, "k1", Rule(max_concurrent=1))
    r = errors.tenant_limit(refused.message, refused.reason, refused.retry_after_s, refused.scope)
    body = json.loads(r.body)["error"]
    assert r.status_code == 429 and r.headers["x-gpuflow-limit"] == "max_concurrent; scope=key"
    assert (body["code"], body["limit"], body["scope"], body["type"]) == \
        ("concurrency_limit_exceeded", MC, KEY, "rate_limit_error")
    assert body["message"].startswith("API key k1 (tenant 't') already has 1 requests in flight")
    assert "gpuflow keys edit" in body["message"]


def run(gateways: list[str], rule: Rule, asks: dict[str, float], seconds: float, refresh_s: float = 0.5,
        step: float = 0.01, tokens_each: int = 0, joins: dict[str, float] | None = None) -> dict[str, int]:
    """Gateways side by side on simulated time: each is asked ``asks[g]`` requests a second for
    tenant t (each request ends at once, spending ``tokens_each``); every ``refresh_s`` each
    reports its demand and all read every row. A gateway in ``joins`` starts at that time: it
    writes its row and reads the others' before it serves (as the gateway's lifespan does); the
    others see it at their next refresh. Returns each gateway's admitted count."""
    joins = joins or {}
    lims = {g: Limits({"t": rule}, now=0.0, me=g) for g in gateways}
    rows = {g: {} for g in gateways if g not in joins}
    for g in rows:
        lims[g].set_shares(rows, 0.0)
    admitted, owed, last = dict.fromkeys(gateways, 0), dict.fromkeys(gateways, 0.0), 0.0
    for i in range(1, int(seconds / step) + 1):
        now = i * step
        for g, at in joins.items():
            if at <= now and g not in rows:
                rows[g] = {}
                lims[g].set_shares(rows, now)
        for g in rows:
            lim = lims[g]
            owed[g] += asks[g] * step
            while owed[g] >= 1.0:
                owed[g] -= 1.0
                if lim.admit("t", now) is None:
                    admitted[g] += 1
                    lim.spend("t", "", tokens_each)
                    lim.done("t")
        if now - last >= refresh_s - 1e-9:
            rows = {g: lims[g].demand(now - last) for g in rows}
            for g in rows:
                lims[g].set_shares(rows, now)
            last = now
    return admitted


# requests_per_s 4 for 20 s: the README's bound is 4 * 20 + each gateway's burst (at most max(1, 4 * share))
@pytest.mark.parametrize("asks,low,high", [
    pytest.param({"a": 50, "b": 50}, 76, 84, id="even"),  # 2 + 2 a second; bursts 2 + 2 at most
    pytest.param({"a": 50, "b": 0}, 70, 84, id="all-on-one"),  # a holds 0.95 of 4 a second: ~77
    pytest.param({"a": 40, "b": 10}, 74, 84, id="uneven"),
])
def test_two_gateways_hold_requests_per_s(asks, low, high):
    got = run(["a", "b"], Rule(requests_per_s=4.0), asks, 20.0)
    assert low <= sum(got.values()) <= high, got


def test_one_gateway_alone_takes_the_whole_limit():
    assert 80 <= sum(run(["a"], Rule(requests_per_s=4.0), {"a": 50}, 20.0).values()) <= 84  # 4 * 20 + burst 4


def test_three_gateways_hold_tokens_per_min():
    # 6000 tokens a minute = 100 a second; each answer 50 tokens: 2 requests a second together, over 30 s
    # 60 plus the buckets' start (6000 split three ways, each may go one answer below zero): at most 60 + 120 + 3
    got = run(["a", "b", "c"], Rule(tokens_per_min=6000), {"a": 20, "b": 20, "c": 20}, 30.0, tokens_each=50)
    assert 150 <= sum(got.values()) <= 183, got


def test_concurrency_parts_add_up_to_the_limit():
    lims = {g: Limits({"t": Rule(max_concurrent=3)}, now=0.0, me=g) for g in ("a", "b")}
    rows = {"a": {"tenant:t": 5.0}, "b": {"tenant:t": 0.0}}  # a sees the traffic: mean 2.5, eps .251
    for lim in lims.values():
        lim.set_shares(rows, 0.0)  # a: 3 * 5.251 / 5.502 = 2.86, b: 0.14 -> a 3, b 0
    held = {g: sum(lim.admit("t", 0.0) is None for _ in range(5)) for g, lim in lims.items()}
    assert held == {"a": 3, "b": 0}
    assert math.isclose(lims["a"].share(TENANT, "t") + lims["b"].share(TENANT, "t"), 1.0)


def test_a_gateway_joining_takes_a_share_without_letting_more_through():
    # a and b hold 4 a second for 20 s; c joins at 10 s with its own callers. Before the others see
    # it (their next refresh, <= 0.5 s) the three shares add up to 1 + c's: c starts with the floor
    # of an idle gateway, so 4 * 20 + the buckets' start (2 + 2 + 1 for c) bounds it still
    got = run(["a", "b", "c"], Rule(requests_per_s=4.0), {"a": 50, "b": 50, "c": 50}, 20.0, joins={"c": 10.0})
    assert 76 <= sum(got.values()) <= 85, got
    assert got["c"] >= 8, got  # c took about a third of the last 10 s
