"""bench/bench_routing.py's arithmetic (the bench itself asserts nothing): what a workload's sizes
come to, what the pinned ideal would find cached, which routes count as believed held, and how
issue 39's targets read the figures."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench import routing_report as rr
from bench import routing_workloads as rw


@pytest.mark.parametrize("fill,replicas,blocks,customers,chars", [
    (0.9, 4, 256, 16, 3686),  # 0.9 x 256 blocks x 64 characters x 4 replicas / 16 = 3,686.4
    (1.0, 4, 256, 16, 4096),  # 256 x 64 x 4 / 16: exactly one replica's cache per 4 customers
    (1.0, 2, 100, 3, 4266),  # 100 x 64 x 2 / 3 = 4,266.7
])
def test_cache_filling_prefixes_share_the_caches_out(fill, replicas, blocks, customers, chars):
    a = SimpleNamespace(fill=fill, replicas=replicas, cache_blocks=blocks, fill_customers=customers)
    assert rw.fill_chars(a) == chars


def _req(who: str, text: str) -> tuple[float, str, dict]:
    return 0.0, who, {"prompt": text}


P = "x" * 200  # a 200-character shared prefix: 3 whole blocks of 64 (192 characters)


@pytest.mark.parametrize("reqs,cached", [
    # a customer's first request finds nothing; its second shares 200 characters: 3 blocks = 192 / 4 = 48 tokens
    ([_req("a", P + "1"), _req("a", P + "2")], [0, 48]),
    # another customer's prefix counts for nothing: each is pinned to its own replica
    ([_req("a", P + "1"), _req("b", P + "2"), _req("a", P + "3")], [0, 0, 48]),
    # the same prompt again: its whole blocks (201 characters: 3 blocks) = 48 tokens
    ([_req("a", P + "1"), _req("a", P + "1")], [0, 48]),
    # under one block in common: nothing
    ([_req("a", "y" * 63 + "1"), _req("a", "y" * 63 + "2")], [0, 0]),
])
def test_the_ideal_finds_the_blocks_a_customer_shared_with_its_last_request(reqs, cached):
    assert rw.ideal_cached(reqs) == cached


@pytest.mark.parametrize("route,held", [
    ("replica=bench-1; matched=3/10 blocks; load=0/16; reason=prefix; index=text", True),
    ("replica=bench-1; matched=0/10 blocks; load=0/16; reason=no-prefix; index=text", False),
    ("", False),  # no header: a baseline, or a gateway that did not say
])
def test_believed_held_reads_the_route_header(route, held):
    assert rr.believed(route) is held


def _m(p90, p99=1.0, p50=0.01, rps=20.0, failed=0):
    return {"p50": p50, "p90": p90, "p99": p99, "rps": rps, "failed": failed}


def test_the_targets_read_the_figures():
    fill = {"cache-aware": _m(0.055, 0.2), "pinned": _m(0.050), "least-outstanding": _m(0.300, 2.0),
            "sglang": _m(0.070, 0.3)}
    met = {w: ok for w, ok, _ in rr.targets({"cache-filling": fill})}
    # 55 ms <= 1.2 x 50 = 60 ms; 300 ms >= 5 x 55 = 275 ms; 55 < 70 and 200 < 300 ms (SGLang's);
    # every figure at or under least-outstanding's; 0 failed
    assert all(met.values()) and len(met) == 5
    fill["cache-aware"] = _m(0.061, 0.2)  # 61 ms > 60 ms, and 300 ms < 5 x 61 = 305 ms: both missed
    met = {w: ok for w, ok, _ in rr.targets({"cache-filling": fill})}
    assert [w for w, ok in met.items() if not ok] == ["cache-filling: TTFT p90 within 1.2x of the pinned ideal",
                                                      "cache-filling: TTFT p90 >= 5x better than least-outstanding"]


@pytest.mark.parametrize("ca,lo,ok", [
    (_m(0.105, 1.05, 0.0105), _m(0.1, 1.0, 0.01), True),  # each 1.05x: within 5%
    (_m(0.106, 1.0, 0.01), _m(0.1, 1.0, 0.01), False),  # p90 1.06x
    (_m(0.1, rps=18.9), _m(0.1, rps=20.0), False),  # 0.945x the throughput
    (_m(0.05, 0.5, 0.005), _m(0.1), True),  # better by far: met
])
def test_no_workload_more_than_5_percent_worse_than_least_outstanding(ca, lo, ok):
    got = [m for w, m, _ in rr.targets({"no-prefix": {"cache-aware": ca, "least-outstanding": lo}}) if "5%" in w]
    assert got == [ok]


def test_a_failed_request_fails_the_target():
    by = {"cache-aware": _m(0.1), "least-outstanding": _m(0.1, failed=1)}
    assert [ok for w, ok, _ in rr.targets({"no-prefix": by}) if w == "0 failed requests"] == [False]


def _done(ttft: float, cached: int, replica: str = "r0") -> dict:
    return {"ok": True, "ttft": ttft, "replica": replica, "route": f"replica={replica}; reason=prefix",
            "usage": {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": cached}}}


def test_the_slowest_requests_are_printed_slowest_first_of_those_counted(capsys):
    from bench.bench_routing import slowest

    res = [_done(0.5, 0), _done(0.2, 90), _done(0.3, 10, "r1"), _done(0.1, 100), {"ok": False}, _done(0.4, 50)]
    reqs = [(t, None, None) for t in (0.5, 5.0, 6.0, 7.0, 8.0, 9.0)]
    counted = [False, True, True, True, True, True]  # the first (0.5 s) arrived in the warm-up: not counted
    slowest(res, reqs, counted, 0.5)  # half of the 4 counted that answered is 2: at least 3 are printed
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == ["400", "300", "200"]  # ms, slowest first; the failed one skipped
    assert "sent at  6.00 s, r1, cached 10/100 tokens, replica=r1; reason=prefix" in lines[1]
