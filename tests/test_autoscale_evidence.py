"""An autoscaler that waits for evidence (issue 25), as tables: quantiles as Prometheus'
``histogram_quantile`` gives them, ``min_samples``, the stable window and the panic window, and
no step taken twice on the same samples. Samples are built by ``combine`` from a gateway's
window, as the activity builds them, with the gateway's own latency buckets. Defaults unless a
row says otherwise: interval 15 s, stable window 60 s, panic window 6 s (so the last sample),
panic threshold 2x, min_samples 20; latency_p95 up above 350 ms (+2), down below 200 ms (-1)."""

from __future__ import annotations

import math

import pytest

from gateway.metrics import LATENCY
from scheduler.autoscale.config import Autoscaling
from scheduler.autoscale import histogram
from scheduler.autoscale.histogram import Histogram, merge, quantile
from scheduler.autoscale.policy import PolicyState, decide
from scheduler.autoscale.signals import Window, combine

INF = math.inf


def gw(*latencies):
    """A gateway histogram (its LATENCY buckets) holding these request latencies."""
    b = {le: float(sum(1 for v in latencies if v <= le)) for le in LATENCY}
    return Histogram.of({**b, INF: float(len(latencies))}, count=len(latencies), total=sum(latencies))


def at(t, *latencies, waiting=0.0, running=1):
    return combine(t, running, [], Window(waiting=waiting, running=0, latency=gw(*latencies) if latencies else None))


def quiet(t0, t1):
    return [at(t) for t in range(t0, t1 + 1, 15)]


def cfg(**kw):
    return Autoscaling.model_validate({"min_replicas": 1, "max_replicas": 4, "rules": ["latency_p95"], **kw})


# --- quantiles exactly as histogram_quantile (promql/quantile.go)
@pytest.mark.parametrize("buckets, q, want", [
    ({0.1: 0, 0.25: 1, INF: 1}, 0.95, 0.2425),       # one request in (0.1, 0.25]: 0.1 + 0.15 x 0.95
    ({0.25: 0, 0.5: 1, INF: 1}, 0.95, 0.4875),       # the probe's "488 ms": 0.25 + 0.25 x 0.95
    ({0.1: 10, 0.2: 20, INF: 20}, 0.25, 0.05),       # rank 5 in (0, 0.1] of 10: 0 + 0.1 x 5/10
    ({0.1: 1, 0.2: 2, INF: 10}, 0.5, 0.2),           # rank 5 lands in +Inf: the highest finite bound
    ({0.1: 5, 0.2: 3, 0.4: 10, INF: 10}, 0.6, 0.24),  # 3 < 5 raised to 5 (ensureMonotonic): rank 6 in
                                                      # (0.2, 0.4] of 5: 0.2 + 0.2 x 1/5
    ({-0.5: 2, 0.5: 4, INF: 4}, 0.25, -0.5),         # rank 1 in a lowest bucket with bound <= 0: that bound
    ({INF: 5}, 0.5, None),                           # no finite bound: NaN in Prometheus, None here
    ({0.1: 0, INF: 0}, 0.5, None),                   # nothing observed
    ({0.1: 1, INF: 1}, 1.5, INF),                    # q > 1: +Inf
    ({0.1: 1, INF: 1}, -0.5, -INF),                  # q < 0: -Inf
])
def test_quantile_is_histogram_quantile(buckets, q, want):
    h = Histogram.of(buckets)
    got = quantile(h, q)
    assert got == (pytest.approx(want) if want not in (None, INF, -INF) else want)


@pytest.mark.parametrize("latencies", [(0.3,), (0.01, 0.02, 0.3, 0.3, 7.0), (400.0, 0.2), tuple(i / 100 for i in range(100))])
def test_a_sparse_histogram_gives_the_same_quantiles_and_merges(latencies):
    h = gw(*latencies)
    s = histogram.sparse(h)
    assert len(s.buckets) <= len(h.buckets)
    for q in (0.1, 0.5, 0.9, 0.95, 0.99):
        assert quantile(s, q) == pytest.approx(quantile(h, q))
        assert quantile(merge([s, gw(0.07)]), q) == pytest.approx(quantile(merge([h, gw(0.07)]), q))


# --- the probe: one request on a 0.3 s engine never scales
def test_one_request_never_scales():
    c = cfg()
    state, hist, current, got = PolicyState(), quiet(0, 60), 1, []
    for t in (75, 90, 105, 120, 135):
        # 1 request at 75 s (P95 0.25 + 0.25 x 0.95 = 488 ms > 350 ms), then nothing
        hist.append(at(t, 0.3) if t == 75 else at(t))
        d, state = decide(c, hist, current=current, starting=0, now=t, state=state)
        current = d.desired
        got.append((d.direction, d.desired))
    # (15, 75]: 1 request, 1 < 20: too few to judge up (and at min_replicas 1, nothing to remove);
    # later windows hold the same 1 or none
    assert got == [("hold", 1)] * 5, d.reason
    assert "1 < 20 requests over 60 s" in decide(c, hist[:6], 1, 0, 75)[0].reason


@pytest.mark.parametrize("n, min_samples, want", [
    (19, 20, 1),  # 19 requests at 300 ms in (0, 75]: 19 < 20: hold
    (20, 20, 3),  # 20 >= 20, P95 488 ms > 350 ms: +2
    (1, 1, 3),    # min_samples is the rule's setting: 1 request then suffices
])
def test_a_rule_votes_only_with_min_samples_requests(n, min_samples, want):
    c = cfg(rules=[{"kind": "latency_p95", "min_samples": min_samples}])
    hist = quiet(0, 60) + [at(75, *[0.3] * n)]
    d, _ = decide(c, hist, current=1, starting=0, now=75)
    assert d.desired == want, d.reason


def test_no_step_twice_on_the_same_samples():
    """The probe's second step: 1 -> 3 at 75 s on a window, then a replica turns RUNNING and, at
    89.9 s (a step not exactly 15 s later), the same sample at 75 s is still inside (74.9, 89.9]:
    before, running 2 + 2 = 4 > 3 gave a second step on it. Now the window starts at the step."""
    c = cfg()
    hist = quiet(0, 60) + [at(75, *[0.3] * 30)]  # 30 requests at 488 ms: +2
    d, state = decide(c, hist, current=1, starting=0, now=75)
    assert (d.direction, d.desired) == ("up", 3)
    hist.append(at(89.9, running=2))  # nothing since; one new replica RUNNING, one starting
    d2, _ = decide(c, hist, current=3, starting=1, now=89.9, state=state)
    assert (d2.direction, d2.desired) == ("hold", 3), d2.reason  # before: up to 4, on the sample at 75 s
    assert state.last_step_at == 75 and "after the last step cover 15 of 60 s" in d2.reason


@pytest.mark.parametrize("latency, n, want, why", [
    (0.45, 30, 3, "in (0.25, 0.5]: 0.25 + 0.25 x 0.95 = 488 ms < 2 x 350 = 700 ms: no burst; and the stable "
                  "window is not covered since the step: hold"),
    (0.75, 30, 5, "30 requests in (0.5, 1]: 0.5 + 0.5 x 0.95 = 975 ms >= 700 ms: a burst, +2"),
    (0.75, 19, 3, "a burst of 19 requests < 20: hold"),
])
def test_a_burst_is_judged_on_the_panic_window_at_twice_the_threshold(latency, n, want, why):
    # a step at 60 s (1 -> 3); the next sample, at 75 s, covers the panic window (6 s, so one
    # 15 s interval) but only 15 of the 60 s stable window
    c = cfg(max_replicas=8)
    hist = quiet(0, 60) + [at(75, *[latency] * n, running=3)]
    d, _ = decide(c, hist, current=3, starting=0, now=75, state=PolicyState(last_step_at=60))
    assert d.desired == want, why + " | " + d.reason


@pytest.mark.parametrize("per_sample, want, why", [
    # latencies in (0.1, 0.25] read 0.1 + 0.15 x 0.95 = 242 ms: above 200 ms, below 350 ms
    ((0.15,) * 10, 3, "40 requests over 60 s at 242 ms: hold"),
    ((0.05,) * 10, 2, "40 requests over 60 s, P95 in (0.025, 0.05]: 49 ms < 200 ms: -1"),
    ((0.15,), 2, "4 requests over 60 s < 20, none waiting: too little traffic to need 3: -1"),
    ((), 2, "no traffic over 60 s: idle, which removes max_step (1 here)"),
])
def test_down_needs_a_covered_stable_window(per_sample, want, why):
    c = cfg(scale_down_stabilization_s=0, max_step=1)
    hist = [at(t, *per_sample) for t in range(0, 61, 15)]
    d, _ = decide(c, hist, current=3, starting=0, now=60)
    assert d.desired == want, why + " | " + d.reason


def test_a_trickle_with_requests_waiting_holds():
    # 4 requests over 60 s, but 2 waiting for a replica at each scrape: no down on too few samples
    c = cfg(scale_down_stabilization_s=0)
    hist = [at(t, 0.15, waiting=2) for t in range(0, 61, 15)]
    d, _ = decide(c, hist, current=3, starting=0, now=60)
    assert d.direction == "hold", d.reason


@pytest.mark.parametrize("bad, field", [
    ({"panic_window_s": 90}, "panic_window_s 90 is longer than stable_window_s 60"),
    ({"panic_threshold": 0.5}, "panic_threshold"),
    ({"rules": [{"kind": "queue_tpot", "min_samples": 0}]}, "min_samples"),
])
def test_window_settings_are_checked(bad, field):
    with pytest.raises(ValueError, match=field):
        cfg(**bad)
