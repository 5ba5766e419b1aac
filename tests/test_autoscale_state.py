"""What the autoscaler carries between steps survives JSON (the workflow's history), +Inf bounds
included, and gateway URLs map to their metrics endpoint."""

from __future__ import annotations

import json
import math

import pytest

from store.serving import metrics_url
from scheduler.autoscale.scrape import parse, window
from activities.autoscale_state import Carry
from scheduler.autoscale.policy import PolicyState
from scheduler.autoscale.signals import Sample

TEXT = """# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{le="0.05"} %d
vllm:inter_token_latency_seconds_bucket{le="+Inf"} %d
vllm:inter_token_latency_seconds_count %d
vllm:inter_token_latency_seconds_sum %f
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting 3
"""


def test_the_carry_round_trips_through_json_and_still_gives_windows():
    c = Carry({})
    c.scrapes = {"engine:a-0": parse(TEXT % (2, 4, 4, 0.3))}
    c.samples = [Sample(at=10.0, running_replicas=1, queue=3.0, tpot_s=0.075)]
    c.policy = PolicyState(direction=1, since=10.0, last_up_at=None)
    back = Carry(json.loads(json.dumps(c.out())))  # strict JSON: no Infinity literal
    h = back.scrapes["engine:a-0"].histograms["tpot"]
    assert h.buckets[-1][0] == math.inf and h.count == 4
    assert back.samples == c.samples and back.policy == c.policy
    # the next scrape: 6 more observations, 3 of them at or under 50 ms (5 - 2), sum 0.9 - 0.3
    w = window(back.scrapes["engine:a-0"], parse(TEXT % (5, 10, 10, 0.9)))
    assert w.tpot.count == 6 and w.tpot.buckets[0] == (0.05, 3) and w.tpot.sum == pytest.approx(0.6)
    assert w.waiting == 3


def test_a_sample_keeps_its_window_and_the_state_its_last_step_through_json():
    """The rules judge several samples' histograms merged (evidence.py), so each carried sample
    keeps its own (sparse); the state keeps when the count last changed."""
    from scheduler.autoscale.histogram import Histogram
    from scheduler.autoscale.signals import Window, combine
    h = Histogram.of({0.1: 0, 0.25: 3, 0.5: 4, math.inf: 5}, count=5, total=1.9)
    s = combine(30.0, 2, [Window(latency=h, queue_time=h, waiting=1, running=1)], Window(queue_time=h))
    assert s.latency.buckets == ((0.1, 0.0), (0.25, 3.0), (0.5, 4.0), (math.inf, 5.0)) and s.finished == 5
    c = Carry({})
    c.samples, c.policy = [s], PolicyState(direction=1, since=15.0, last_up_at=15.0, last_step_at=15.0)
    back = Carry(json.loads(json.dumps(c.out())))
    assert back.samples == [s] and back.policy == c.policy
    old = Carry({"samples": [{"at": 1.0, "running_replicas": 1}], "policy": {"direction": 1}})  # before the fields
    assert old.samples[0].latency is None and old.policy.last_step_at is None


@pytest.mark.parametrize("keep_s, kept", [
    (100, [0.0, 50.0, 100.0]),  # 100 - 0 <= 100: all kept
    (60, [50.0, 100.0]),        # 100 - 0 > 60: the oldest goes
    (0, [100.0]),               # only now's
])
def test_keep_drops_samples_older_than_the_window(keep_s, kept):
    c = Carry({"samples": [{"at": t, "running_replicas": 1} for t in (0.0, 50.0, 100.0)]})
    c.keep(100.0, keep_s)
    assert [s.at for s in c.samples] == kept


@pytest.mark.parametrize("url, metrics", [
    ("http://10.0.0.5:8080/v1", "http://10.0.0.5:8080/metrics"),
    ("http://10.0.0.5:8080/v1/", "http://10.0.0.5:8080/metrics"),
    ("http://gw:80", "http://gw:80/metrics"),
])
def test_a_gateway_url_maps_to_its_metrics(url, metrics):
    assert metrics_url(url) == metrics


@pytest.mark.parametrize("bad", [
    {"scrapes": {"x": {"histograms": {"tpot": {"buckets": "nope"}}}}},
    {"samples": [{"at": "later"}]},
    {"samples": [7]},
    {"policy": {"direction": "up"}},
])
def test_a_malformed_carry_is_refused_by_the_decoder(bad):
    """autoscale_step then starts afresh (activities/autoscale.py), instead of failing every step."""
    with pytest.raises((KeyError, TypeError, ValueError, AttributeError)):
        Carry(bad)
