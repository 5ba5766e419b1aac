"""A prefill/decode group's routing (gateway/pd_pick.py, balance.py, table.py) as tables: which
generation serves, which ends a request gets, when the prefill is skipped or the decode serves the
request whole, and the store read the table is built from. Comments show the arithmetic."""

from __future__ import annotations

import random

import pytest
from sqlmodel import Session

from store import serving
from store.serving import Members, Route
from store.tables import InstanceRow
from gateway import table as tables
from gateway.balance import Balancer, Prompt
from gateway.cache_aware import Knobs, choose
from gateway.pd_pick import (ALL, ANY_PER_ROLE, DISAGGREGATED, FALLBACK, SGLANG, SKIPPED, VLLM, PDGroup, Pick,
                             estimate_tokens, pick, pick_decode, protocol_of)


def m(name: str, role: str, gen: int = 0, worker: str = "w1") -> Route:
    return Route(name, "pd", "127.0.0.1", 9000, worker=worker, role=role, group_gen=gen)


P0, P1, D0, D1 = m("p0", "prefill"), m("p1", "prefill", worker="w2"), m("d0", "decode", worker="w2"), m("d1", "decode")


def g(*members: Route, readiness: str = ANY_PER_ROLE, wanted=(), skip: int = 16) -> PDGroup:
    return PDGroup("custom", readiness, skip, tuple(members), tuple(wanted))


@pytest.mark.parametrize("group,started,expect", [
    (g(P0, D0), (), 0),  # gen 0 has a prefill and a decode: ready
    (g(P0, D0, m("p9", "prefill", 1), m("d9", "decode", 1)), (), 1),  # gen 1 ready too: the newest serves
    (g(P0, D0, m("p9", "prefill", 1)), (), 0),  # gen 1 has no decode yet: gen 0 keeps serving
    (g(D0), (), 0),  # no prefill RUNNING: the decode serves whole (fallback), any_per_role
    (g(P0), (), None),  # no decode: nothing can serve
    # all: gen 0 wants p0, d0, d1; d1 not RUNNING -> not ready, never seen ready -> not served
    (g(P0, D0, readiness=ALL, wanted=[(0, frozenset({"p0", "d0", "d1"}))]), (), None),
    (g(P0, D0, D1, readiness=ALL, wanted=[(0, frozenset({"p0", "d0", "d1"}))]), (), 0),  # every wanted one RUNNING
    # seen ready before, lost d1 since: it keeps serving (degraded), it is not stopped
    (g(P0, D0, readiness=ALL, wanted=[(0, frozenset({"p0", "d0", "d1"}))]), (0,), 0),
    # all, gen 1 (wants p9, d9) ready: it takes over from the started gen 0
    (g(P0, D0, m("p9", "prefill", 1), m("d9", "decode", 1), readiness=ALL,
       wanted=[(0, frozenset({"p0", "d0", "d1"})), (1, frozenset({"p9", "d9"}))]), (0,), 1),
])
def test_which_generation_serves(group, started, expect):
    assert group.serving(frozenset(started)) == expect


def ends(group: PDGroup, in_flight=None, tokens=100, exclude=(), bad=None, matched=None, uncached=None,
         limit=4, seeds=30) -> set[tuple]:
    """Every (path, prefill, decode) the rule gives over ``seeds`` draws; None when it waits."""
    out = set()
    for s in range(seeds):
        inf = dict(in_flight or {})
        p = pick(group, 0, limit, inf, bad or {}, 10.0, frozenset(exclude), tokens,
                 lambda ps: choose(ps, limit, inf, lambda i: (matched or {}).get(i, 0), 10, Knobs(), random.Random(s),
                                   bad or {}, 10.0, frozenset(exclude)),
                 lambda d: (uncached or {}).get(d.instance, tokens), 2, random.Random(s))
        out.add(None if p is None else (p.path, p.prefill and p.prefill.instance, p.decode.instance))
    return out


@pytest.mark.parametrize("kw,expect", [
    # p0 on w1 holds 7 of 10 blocks: it prefills; d1 shares w1 with it, both decodes idle -> d1
    (dict(matched={"p0": 7}), {(DISAGGREGATED, "p0", "d1")}),
    (dict(matched={"p1": 7}), {(DISAGGREGATED, "p1", "d0")}),  # p1 on w2 -> d0 on w2
    # d1 (near p0) has 2 in flight, d0 none: 2 <= 0 + slack 2 -> still d1
    (dict(matched={"p0": 7}, in_flight={"d1": 2}), {(DISAGGREGATED, "p0", "d1")}),
    (dict(matched={"p0": 7}, in_flight={"d1": 3}), {(DISAGGREGATED, "p0", "d0")}),  # 3 > 0 + 2: d0
    (dict(tokens=15), {(SKIPPED, None, "d0"), (SKIPPED, None, "d1")}),  # 15 < 16 tokens: no prefill
    (dict(tokens=16, matched={"p0": 7}), {(DISAGGREGATED, "p0", "d1")}),  # 16 is not below 16
    # 100 tokens, d1 (the decode near p0) holds all but 10 of them: 10 < 16, it prefills them itself
    (dict(matched={"p0": 7}, uncached={"d1": 10}), {(SKIPPED, None, "d1")}),
    (dict(exclude=("p0", "p1")), {(FALLBACK, None, "d0"), (FALLBACK, None, "d1")}),  # both prefills failed
    (dict(bad={"p0": 99.0}, matched={"p0": 7}), {(DISAGGREGATED, "p1", "d0")}),  # p0 marked bad until 99 > now 10
    (dict(in_flight={"p0": 4, "p1": 4}), {None}),  # both prefills at their limit 4: it waits, never aggregated
    (dict(in_flight={"d0": 4, "d1": 4}), {None}),  # both decodes at 4: it waits, no prefill slot taken
])
def test_ends_of_a_request(kw, expect):
    assert ends(g(P0, P1, D0, D1), **kw) == expect


def test_no_prefill_running_is_a_fallback_and_no_decode_waits():
    assert ends(g(D0, D1)) == {(FALLBACK, None, "d0"), (FALLBACK, None, "d1")}
    assert ends(g(P0, D0), exclude=("d0",)) == {None}  # its only decode failed already: nothing to try


@pytest.mark.parametrize("mode,expect", [("vllm-nixl", VLLM), ("vllm-mooncake", VLLM), ("custom", VLLM),
                                         ("vllm-ascend-mooncake", VLLM), ("sglang-mooncake", SGLANG),
                                         ("sglang-nixl", SGLANG)])
def test_protocol_per_mode(mode, expect):
    assert protocol_of(mode) == expect


@pytest.mark.parametrize("chars,tokens,expect", [(400, None, 100), (401, None, 101), (0, None, 0), (400, 37, 37)])
def test_tokens_estimated(chars, tokens, expect):
    assert estimate_tokens(chars, tokens) == expect  # ceil(chars / 4) when not tokenized


def test_decode_near_the_prefill_and_the_header():
    # near w1: d1 (w1, 1 in flight) against d0 (w2, 0): 1 <= 0 + 1 -> d1; slack 0 -> d0
    assert pick_decode([D0, D1], 4, {"d1": 1}, {}, 0.0, frozenset(), "w1", 1, random.Random(0)) == D1
    assert pick_decode([D0, D1], 4, {"d1": 1}, {}, 0.0, frozenset(), "w1", 0, random.Random(0)) == D0
    p = Pick(3, DISAGGREGATED, D1, P0, uncached=90, tokens=100)
    assert p.header() == "prefill=p0; decode=d1; kv=remote; path=disaggregated; gen=3; uncached=90/100 tokens"
    assert Pick(0, FALLBACK, D0).header().startswith("prefill=none; decode=d0; kv=local; path=fallback")
    assert p.routes() == (P0, D1) and Pick(3, DISAGGREGATED, D1, P0, retry=True).routes() == (D1,)


SPEC = {"name": "pd", "backend": "custom", "roles": [{"name": "prefill"}, {"name": "decode"}],
        "disaggregation": {"mode": "vllm-nixl", "readiness": "all", "skip_prefill_below": 64}}


@pytest.mark.parametrize("spec,expect", [
    (SPEC, ("vllm-nixl", ALL, 64)),
    ({**SPEC, "disaggregation": {"mode": "sglang-nixl"}}, ("sglang-nixl", ANY_PER_ROLE, 16)),  # defaults
    ({**SPEC, "roles": [*SPEC["roles"], {"name": "router"}]}, None),  # a router: the only front door, as before
    ({"name": "plain", "backend": "vllm"}, None),
    ({**SPEC, "disaggregation": {"mode": "custom", "skip_prefill_below": True}}, ("custom", ANY_PER_ROLE, 16)),
])
def test_table_pairs_a_group_without_a_router(spec, expect):
    t = tables.build([], {"pd": spec}, 4, members={"pd": Members((P0, D0))})
    pd = t.models["pd"].pd
    assert (pd and (pd.mode, pd.readiness, pd.skip_below)) == expect
    assert t.models["pd"].size == (2 if expect else 0)  # /v1/models counts a paired group's members


R0, R1 = m("r0", "router"), m("r1", "router", 1)
ROUTED = {**SPEC, "roles": [*SPEC["roles"], {"name": "router"}], "disaggregation": {"mode": "custom"}}


@pytest.mark.parametrize("routers,members,readiness,expect", [
    ((R0,), (P0, D0), "any_per_role", ["r0"]),  # one generation: its router, as before
    ((R0, R1), (P0, D0), "any_per_role", ["r0"]),  # gen 1's router RUNNING, its members not yet: gen 0 serves
    ((R0, R1), (P0, D0, m("p9", "prefill", 1)), "any_per_role", ["r0"]),  # gen 1 has a prefill, no decode yet
    ((R0, R1), (P0, D0, m("p9", "prefill", 1), m("d9", "decode", 1)), "any_per_role", ["r1"]),  # gen 1 ready
    # all: gen 1 wants p9, d9 and d8; d8 not RUNNING -> gen 0 keeps serving
    ((R0, R1), (P0, D0, m("p9", "prefill", 1), m("d9", "decode", 1)), "all", ["r0"]),
    ((R1,), (m("p9", "prefill", 1), m("d9", "decode", 1)), "all", ["r1"]),  # gen 0 gone: one router left, it serves
])
def test_a_group_rolled_whole_is_served_by_one_generations_router(routers, members, readiness, expect):
    spec = {**ROUTED, "disaggregation": {"mode": "custom", "readiness": readiness}}
    wanted = ((0, frozenset({"p0", "d0"})), (1, frozenset({"p9", "d9", "d8"})))
    t = tables.build(list(routers), {"pd": spec}, 4, members={"pd": Members(members, wanted)})
    assert [r.instance for r in t.models["pd"].replicas] == expect


def test_group_members_read_from_the_store(store):
    _, _, engine = store
    with Session(engine) as s:
        for name, role, state, wanted, gen in (("pd-0", "prefill", "running", True, 0),
                                               ("pd-1", "decode", "running", True, 0),
                                               ("pd-2", "decode", "starting", True, 0),  # wanted, not RUNNING yet
                                               ("pd-3", "decode", "running", False, 1),  # RUNNING, no longer wanted
                                               ("pd-4", "prefill", "deleted", False, 1),  # neither
                                               ("pd-5", "router", "running", True, 0)):  # routes() has it
            s.add(InstanceRow(name=name, deployment="pd", state=state, role=role, group_name="pd", wanted=wanted,
                              group_gen=gen, address="10.0.0.1", port=8000, worker="w1", bootstrap_port=9100))
        s.commit()
    got = serving.group_members(engine)["pd"]
    assert [(r.instance, r.role, r.group_gen, r.bootstrap_port) for r in got.routes] == [
        ("pd-0", "prefill", 0, 9100), ("pd-1", "decode", 0, 9100), ("pd-3", "decode", 1, 9100)]
    assert got.wanted == ((0, frozenset({"pd-0", "pd-1", "pd-2"})),)
    assert [r.instance for r in serving.routes(engine)] == ["pd-5"]


async def test_balancer_takes_both_ends_and_releases_them():
    b = Balancer(1.0, 10, 5.0, rng=random.Random(0))
    b.swap(tables.build([], {"pd": SPEC}, 4, members={"pd": Members((P0, D1), ((0, frozenset({"p0", "d1"})),))}))
    pr = Prompt(blocks=(1, 2, 3), chars=400)  # 100 tokens, 3 blocks of 128 chars
    p, waited = await b.acquire("pd", prompt=pr)
    assert (p.path, p.prefill, p.decode, waited) == (DISAGGREGATED, P0, D1, 0.0) and pr.pick is p
    assert b.in_flight == {"p0": 1, "d1": 1} and b.started == {"pd": {0}}
    b.release(p.prefill, "pd")  # the prefill answered: its slot goes first
    assert b.in_flight == {"d1": 1}
    # the same prompt again: d1 holds its 3 blocks (3 * 128 = 384 of 400 chars): 100 - 100 * 384 // 400 = 4 < 64
    p2, _ = await b.acquire("pd", prompt=Prompt(blocks=(1, 2, 3), chars=400))
    assert (p2.path, p2.uncached, p2.decode) == (SKIPPED, 4, D1) and b.in_flight == {"d1": 2}
    b.release(p2, "pd")
    b.release(p.decode, "pd")
    assert b.in_flight == {}


async def test_a_groups_members_have_their_cache_sizes_asked():
    # the prefix index sizes each prefill's cache from its engine, as a replica's (gateway/cache_watch.py):
    # the members are asked once each (the probe itself: tests/test_engine_cache.py)
    from gateway.cache_watch import CacheWatch

    b = Balancer(1.0, 10, 5.0)
    w = CacheWatch(b, 128, kv_events=False)
    w.on_table(tables.build([], {"pd": SPEC}, 4, members={"pd": Members((P0, D1))}))
    assert sorted(w.sizes) == [("d1", "127.0.0.1", 9000), ("p0", "127.0.0.1", 9000)]
    await w.close()


async def test_least_outstanding_group_picks_the_least_loaded_prefill():
    # routing least-outstanding: p0 holds the prompt's 3 blocks but has 1 in flight, p1 none: p1 (the
    # cache is not weighed); cache-aware (the default): p0, its 3 blocks matched (1 <= 0 + slack 2)
    for routing, want in (("least-outstanding", "p1"), (None, "p0")):
        b = Balancer(1.0, 10, 5.0, rng=random.Random(0))
        spec = {**SPEC, "disaggregation": {"mode": "custom"}, **({"routing": routing} if routing else {})}
        b.swap(tables.build([], {"pd": spec}, 4, members={"pd": Members((P0, P1, D0, D1))}))
        b.index.insert("p0", (1, 2, 3))
        b.in_flight["p0"] = 1
        p, _ = await b.acquire("pd", prompt=Prompt(blocks=(1, 2, 3), chars=400))
        assert p.prefill.instance == want
