"""The autoscaling policy as tables: each rule at and around its thresholds, the evidence a rule
needs (min_samples, the stable and panic windows, fresh samples after a step), stabilization and
its reset, starting replicas as capacity, a flapping load, and histogram windows across an engine
restart. Times are seconds on the caller's clock; samples come every 15 s."""

from __future__ import annotations

import math

import pytest

from scheduler.autoscale.config import Autoscaling
from scheduler.autoscale.histogram import Histogram, delta, merge, quantile, sparse
from scheduler.autoscale.policy import PolicyState, decide
from scheduler.autoscale.signals import Sample, Window, combine

INF = math.inf


def lat(v, n):
    """n requests that took just under v seconds: all in the bucket (v - 1 ms, v], so any
    quantile reads v - 1 ms x (1 - q): P95 = v - 0.05 ms."""
    return Histogram.of({v - 0.001: 0, v: n, INF: n}, count=n, total=v * n) if n else None


def s(at, queue=0.0, tpot=None, p95=None, q90=None, requests=30.0, complete=True, running=1):
    """A 15 s sample in which ``requests`` finished (none in flight at its end), each with the
    given latency, queue time and TPOT (10 tokens a request)."""
    n = requests
    return Sample(at=at, running_replicas=running, complete=complete, requests=n, queue=queue,
                  tpot_s=tpot, latency_p95_s=p95, queue_time_p90_s=q90, finished=n,
                  tpot_sum=(tpot or 0.0) * 10 * n if tpot is not None else 0.0,
                  tpot_count=10 * n if tpot is not None else 0.0,
                  latency=lat(p95, n) if p95 is not None else None,
                  queue_time=lat(q90, n) if q90 is not None else None)


def cfg(**kw):
    # one-interval windows unless a test says otherwise: each table row is then one or two samples
    base = {"min_replicas": 1, "max_replicas": 10, "scale_down_stabilization_s": 0,
            "stable_window_s": 15, "panic_window_s": 15}
    return Autoscaling.model_validate({**base, **kw})


# --- queue_tpot at and around its thresholds (up: queue >= 8 and TPOT > 120 ms; down: <= 2 and < 60 ms)
@pytest.mark.parametrize("queue, tpot, want", [
    (8.0, 0.121, 3),   # 8 >= 8 and 121 > 120 ms: up by 1 (2 -> 3)
    (8.0, 0.120, 2),   # 120 ms is not > 120 ms: hold
    (7.9, 0.500, 2),   # 7.9 < 8: hold however slow
    (20.0, 0.100, 2),  # long queue, fast tokens: hold (the engine keeps up)
    (2.0, 0.059, 1),   # 2 <= 2 and 59 < 60 ms: down by 1
    (2.0, 0.060, 2),   # 60 ms is not < 60 ms: hold
    (2.1, 0.010, 2),   # 2.1 > 2: hold
])
def test_queue_tpot_thresholds(queue, tpot, want):
    # down needs the signals to cover one interval (15 s): samples at 0 and 15, decision at 15
    hist = [s(0, queue, tpot), s(15, queue, tpot)]
    d, _ = decide(cfg(), hist, current=2, starting=0, now=15)
    assert d.desired == want, d.reason


def test_idle_window_counts_tpot_as_zero():
    # no traffic at all: queue 0, nothing served, no TPOT measured -> TPOT counts as 0 -> down
    hist = [s(0, requests=0), s(15, requests=0)]
    d, _ = decide(cfg(min_replicas=0), hist, current=1, starting=0, now=15)
    assert (d.direction, d.desired) == ("down", 0)


# --- latency_p95: > 350 ms over 15 s adds 2; < 200 ms over 30 s removes 1; 200-350 ms holds. Each
# window's P95 is taken over its samples' merged histograms (30 requests a sample).
@pytest.mark.parametrize("p95s, want, why", [
    ([0.36, 0.36], 5, "361 > 350 ms in the 15 s window: +2 (3 -> 5)"),
    ([0.10, 0.36], 5, "only the last sample is inside (now-15, now]: +2"),
    ([0.36, 0.35], 3, "350 ms is not above 350 ms: hold"),
    ([0.19, 0.19, 0.19], 2, "< 200 ms over 30 s (samples at 0, 15, 30 cover it): -1"),
    ([0.19, 0.25, 0.19], 3, "30 at 250 ms, 30 at 190 ms in (0, 30]: rank 57 of 60 is at 250 ms: hold"),
])
def test_latency_p95_band(p95s, want, why):
    hist = [s(15 * i, p95=v) for i, v in enumerate(p95s)]
    c = cfg(rules=[{"kind": "latency_p95", "down_window_s": 30}])
    d, _ = decide(c, hist, current=3, starting=0, now=hist[-1].at)
    assert d.desired == want, why + " | " + d.reason


def test_latency_p95_down_needs_a_covered_window():
    # samples at 0 and 15 only cover 15 of the 30 s down window: hold
    hist = [s(0, p95=0.1), s(15, p95=0.1)]
    d, _ = decide(cfg(rules=[{"kind": "latency_p95", "down_window_s": 30}]), hist, current=3, starting=0, now=15)
    assert d.direction == "hold" and "cover" in d.reason


# --- queue_time_p90 over ``samples`` intervals (3 x 15 = 45 s): the merged P90 above 800 ms scales up
@pytest.mark.parametrize("p90s, want", [
    ([0.5, 0.9, 0.9, 0.9], 3),  # (0, 45]: 90 requests at 900 ms: P90 900 > 800 ms: +1
    ([0.9, 0.9, 0.9], 2),       # samples at 0, 15, 30 cover 30 of 45 s: hold
    ([0.5, 0.7, 0.7, 0.9], 3),  # 60 at 700 ms, 30 at 900 ms: rank 81 of 90 falls among the 900s: +1
    ([0.9, 0.7, 0.7, 0.7], 2),  # the 900s at 0 are outside (0, 45]: P90 700 ms: hold
])
def test_queue_time_p90_over_its_window(p90s, want):
    hist = [s(15 * i, q90=v) for i, v in enumerate(p90s)]
    d, _ = decide(cfg(rules=[{"kind": "queue_time_p90", "samples": 3}]), hist, current=2, starting=0,
                  now=hist[-1].at)
    assert d.desired == want, d.reason


def test_any_rule_up_wins_down_needs_all():
    c = cfg(rules=["queue_tpot", "latency_p95"])
    # queue_tpot votes down (1 <= 2, 50 < 60 ms), latency_p95 votes up (400 > 350 ms): up by 2
    hist = [s(0, 1, 0.05, p95=0.4), s(15, 1, 0.05, p95=0.4)]
    assert decide(c, hist, current=2, starting=0, now=15)[0].desired == 4
    # queue_tpot down, latency_p95 holds (250 ms): hold
    hist = [s(t, 1, 0.05, p95=0.25) for t in (0, 15, 30)]
    assert decide(c, hist, current=2, starting=0, now=30)[0].direction == "hold"
    # both down (p95 150 ms over 30 s): down by the smaller step, 1
    hist = [s(t, 1, 0.05, p95=0.15) for t in (0, 15, 30)]
    assert decide(c, hist, current=3, starting=0, now=30)[0].desired == 2


# --- stabilization, and its reset on a change of direction
def test_down_must_hold_for_its_window_and_a_change_of_direction_resets_it():
    c = cfg(scale_down_stabilization_s=60)
    low, high = (1, 0.05), (9, 0.2)
    state, hist = PolicyState(), []
    seq = [low, low, low, high, low, low, low, low, low]  # at 0, 15, ..., 120
    out = []
    for i, (q, t) in enumerate(seq):
        now = 15 * i
        hist.append(s(now, q, t))
        d, state = decide(c, hist, current=3, starting=0, now=now, state=state)
        out.append(d.direction)
    # down run from 0 is broken by the up vote at 45 (which adds a replica, so hist shows a scale-up);
    # the new down run starts at 60 and must hold 60 s: first down at 120
    assert out == ["hold", "hold", "hold", "up", "hold", "hold", "hold", "hold", "down"]


def test_up_stabilization():
    c = cfg(scale_up_stabilization_s=30)
    state, hist, got = PolicyState(), [s(-15, 10, 0.2)], []
    for now in (0, 15, 30):
        hist.append(s(now, 10, 0.2))
        d, state = decide(c, hist, current=2, starting=0, now=now, state=state)
        got.append(d.desired)
    assert got == [2, 2, 3]  # up since 0; held 0 s, 15 s, then 30 s >= 30 s: +1


# --- starting replicas count as capacity; no scale-down while one is starting
def test_starting_replicas_cover_a_burst():
    hot = [s(0, 10, 0.2), s(15, 10, 0.2)]
    # 2 replicas, 1 of them still starting: running 1 + step 1 = 2 <= 2 already there: hold
    d, _ = decide(cfg(), hot, current=2, starting=1, now=15)
    assert (d.direction, d.desired) == ("hold", 2)
    assert "still starting" in d.reason
    # latency_p95 wants +2: running 1 + 2 = 3 > 2: up to 3 (one more)
    d, _ = decide(cfg(rules=["latency_p95"]), [s(0, p95=0.5), s(15, p95=0.5)], current=2, starting=1, now=15)
    assert d.desired == 3


def test_no_scale_down_while_starting():
    cold = [s(0, 0, 0.01), s(15, 0, 0.01)]
    d, _ = decide(cfg(), cold, current=3, starting=1, now=15)
    assert d.direction == "hold" and "still starting" in d.reason


def test_no_scale_down_without_evidence():
    c = cfg(scale_down_stabilization_s=30)
    cold = [s(t, 0, 0.01) for t in (0, 15, 30)]
    # a failed scrape inside the 30 s window is no evidence of idleness
    broken = cold[:2] + [s(30, 0, 0.01, complete=False)]
    assert decide(c, broken, 3, 0, 30, PolicyState(-1, 0))[0].direction == "hold"
    # a replica added 15 s ago: hold; 30 s ago: down
    assert decide(c, cold, 3, 0, 30, PolicyState(-1, 0, last_up_at=15))[0].direction == "hold"
    assert decide(c, cold, 3, 0, 30, PolicyState(-1, 0, last_up_at=0))[0].direction == "down"


def test_a_flapping_load_does_not_flap_the_replicas():
    # load alternates hot and cold every sample for 10 minutes; down needs 300 s of cold in a row,
    # so the count only ever goes up (once per hot sample while nothing is starting) and never down
    c = cfg(scale_down_stabilization_s=300, max_replicas=4)
    state, hist, current, counts = PolicyState(), [], 1, []
    for i in range(40):
        now = 15 * i
        hist.append(s(now, *((10, 0.2) if i % 2 == 0 else (0, 0.01))))
        d, state = decide(c, hist, current=current, starting=0, now=now, state=state)
        current = d.desired
        counts.append(current)
    assert counts == sorted(counts) and counts[-1] == 4  # monotonic: no flapping


# --- bounds, step, and cold start
@pytest.mark.parametrize("current, want, rule", [
    (0, 1, "min_replicas"),   # below min 1: up to 1
    (12, 10, "max_replicas"),  # above max 10: down to 10
])
def test_bounds(current, want, rule):
    d, _ = decide(cfg(), [], current=current, starting=0, now=0)
    assert (d.desired, d.rule) == (want, rule)


def test_max_step_bounds_a_jump():
    d, _ = decide(cfg(min_replicas=9, max_replicas=20, max_step=4), [], current=2, starting=0, now=0)
    assert d.desired == 6  # min 9, but at most +4 at a time: 2 -> 6


def test_cold_start_from_zero_is_immediate():
    c = cfg(min_replicas=0, scale_up_stabilization_s=60)
    d, _ = decide(c, [s(0, queue=1, requests=0, running=0)], current=0, starting=0, now=0)
    assert (d.desired, d.rule) == (1, "cold_start")  # no 60 s wait with a request held


# --- histograms: windows from bucket deltas, across a counter reset
def test_histogram_delta_and_quantile():
    prev = Histogram.of({0.1: 10, 0.2: 20, INF: 20}, count=20, total=2.0)
    cur = Histogram.of({0.1: 10, 0.2: 30, INF: 40}, count=40, total=6.0)
    w = delta(prev, cur)
    # in the window: 0 in (0, 0.1], 10 in (0.1, 0.2], 10 above 0.2; count 20, sum 4.0
    assert w.buckets == ((0.1, 0.0), (0.2, 10.0), (INF, 20.0)) and (w.count, w.sum) == (20, 4.0)
    # P50 is rank 10: the end of the (0.1, 0.2] bucket -> 0.2; P25 is rank 5: 0.1 + 0.1 * 5/10 = 0.15
    assert quantile(w, 0.5) == pytest.approx(0.2)
    assert quantile(w, 0.25) == pytest.approx(0.15)
    # P95 is rank 19, in +Inf: the highest finite bound, 0.2
    assert quantile(w, 0.95) == pytest.approx(0.2)


def test_histogram_counter_reset_is_an_engine_restart():
    prev = Histogram.of({0.1: 100, INF: 100}, count=100, total=5.0)
    cur = Histogram.of({0.1: 3, INF: 4}, count=4, total=0.5)  # restarted: counts fell
    w = delta(prev, cur)
    assert (w.count, w.sum) == (4, 0.5)  # the window holds the new process's 4 observations, never -96


def test_merge_and_combine_replicas_with_the_gateway():
    a = Histogram.of({0.05: 4, 0.1: 8, INF: 8}, count=8, total=0.6)
    b = Histogram.of({0.1: 2, INF: 2}, count=2, total=0.1)
    m = merge([a, b])
    # union of bounds 0.05, 0.1, inf: b contributes 0 at 0.05 (its first bound is 0.1)
    assert m.buckets == ((0.05, 4.0), (0.1, 10.0), (INF, 10.0)) and m.count == 10
    tpot = Histogram.of({0.2: 10, INF: 10}, count=10, total=1.5)
    engines = [Window(waiting=12, running=4, tpot=tpot), Window(waiting=4, running=4, tpot=tpot), Window()]
    gw = Window(waiting=8, latency=m)
    got = combine(30, 3, engines, gw)
    # queue per replica = (12 + 4 engine waiting + 8 gateway queue) / 3 replicas = 8
    # TPOT = mean of the engines' windows = (1.5 + 1.5) / 20 = 0.15 s; the third engine has no
    # metrics, so latency falls back to the gateway's histogram: P95 = rank 9.5 of 10, in (0.05, 0.1]
    # = 0.05 + 0.05 * (9.5 - 4) / 6 = 0.0958
    assert got.queue == 8 and got.tpot_s == pytest.approx(0.15)
    assert got.latency_p95_s == pytest.approx(0.05 + 0.05 * 5.5 / 6)
    assert got.complete
    assert not combine(30, 3, engines + [Window(ok=False)], gw).complete  # a failed scrape


@pytest.mark.parametrize("bad, field", [
    ({"min_replicas": 3, "max_replicas": 2}, "min_replicas 3 is above max_replicas 2"),
    ({"rules": ["queue_tpot", "queue_tpot"]}, "given twice"),
    ({"rules": ["p99"]}, "p99"),
    ({"rules": []}, "at least 1"),
    ({"interval_s": 0}, "interval_s"),
    ({"max_replicas": 100000}, "max_replicas"),
])
def test_config_errors_name_the_problem(bad, field):
    with pytest.raises(ValueError, match=field):
        Autoscaling.model_validate({"max_replicas": 4, **bad})


# --- asking the scheduler before scaling up: k dry placements, each booked for the next
def _custom(vram_gib=10):
    from scheduler.spec import ModelSpec
    return ModelSpec.model_validate({"name": "chat", "backend": "custom", "run_command": "serve {port}",
                                     "source": {"local_path": "/m"}, "worker_selector": {"zone": "a"},
                                     "resources": {"vram": f"{vram_gib} GiB", "ram": "1 GiB"}})


@pytest.mark.parametrize("gpus, k, fits", [
    ([24, 24], 5, 4),  # 10 GiB replicas: two on each 24 GiB GPU (24 - 2 x 10 = 4 left) -> 4 of 5
    ([24, 24], 3, 3),  # all fit
    ([8], 2, 0),       # 8 GiB < 10 GiB: none
])
def test_fit_books_each_dry_placement(gpus, k, fits):
    from scheduler.autoscale.fit import demand, fit
    from scheduler.request import FlatRequest
    from scheduler.units import GiB
    from tests.conftest import cluster, gpu, worker
    snap = cluster([worker(f"w{i}", 64, [gpu(0, g)], labels={"zone": "a"}) for i, g in enumerate(gpus)])
    req = FlatRequest(vram=10 * GiB, ram=GiB)
    got = fit(snap, _custom(), req, k)
    assert got.fits == fits and got.blocked == (fits < k)
    assert len(snap.instances) == 0  # the snapshot itself is untouched
    if got.blocked:
        assert got.reasons  # the scheduler's own words for the first replica that did not fit
        d = demand(_custom(), req, got)
        assert d["replicas"] == k - fits
        assert d["per_replica"]["vram_bytes"] == 10 * GiB and d["worker_selector"] == {"zone": "a"}
