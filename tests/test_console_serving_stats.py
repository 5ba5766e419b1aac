"""The console's serving figures (console/serving_stats.py): percentiles from a gateway's
own Prometheus histograms, the request rate between two readings, several gateways together, and
a gateway that does not answer."""

from __future__ import annotations

import asyncio

import httpx2 as httpx
import pytest
from prometheus_client import generate_latest

from scheduler.autoscale.scrape import parse
from console import serving_stats as ss
from gateway.metrics import Metrics
from gpuflow.ports import server_port
from scheduler.autoscale.histogram import Histogram


def scrape(latencies: list[float], ttfts: list[float], model: str = "chat"):
    """A real gateway registry's text for ``model`` (and noise for another model), parsed as the console does."""
    m = Metrics()
    for v in latencies:
        m.duration.labels(model).observe(v)
    for v in ttfts:
        m.ttft.labels(model).observe(v)
    m.duration.labels("other").observe(100.0)  # another deployment's request: never counted here
    return parse(generate_latest(m.registry).decode(), model)


# the gateway's latency buckets (gateway/metrics.py LATENCY): ... 0.025, 0.05, 0.1, 0.25, 0.5 ...
@pytest.mark.parametrize("observed, want", [
    # nothing observed: no percentile (Prometheus' NaN)
    ([], {0.5: None, 0.95: None, 0.99: None}),
    # 4 x 30 ms in (0.025, 0.05], 1 x 200 ms in (0.1, 0.25]; count 5
    # p50: rank 2.5 of the first bucket's 4: 0.025 + 0.025 x 2.5/4 = 0.040625
    # p95: rank 4.75, 0.75 into the (0.1, 0.25] bucket's 1: 0.1 + 0.15 x 0.75 = 0.2125
    # p99: rank 4.95: 0.1 + 0.15 x 0.95 = 0.2425
    ([0.03] * 4 + [0.2], {0.5: 0.040625, 0.95: 0.2125, 0.99: 0.2425}),
    # one 2 s request in (1, 2.5]: p50 rank 0.5: 1 + 1.5 x 0.5 = 1.75
    ([2.0], {0.5: 1.75, 0.95: 1 + 1.5 * 0.95, 0.99: 1 + 1.5 * 0.99}),
    # past the last finite bound (300 s): the highest finite bound
    ([1000.0], {0.5: 300.0, 0.95: 300.0, 0.99: 300.0}),
])
def test_percentiles_from_a_gateways_buckets(observed, want):
    got = ss.percentiles(scrape(observed, []).histograms.get("latency"))
    assert got == pytest.approx(want) if observed else got == want


@pytest.mark.parametrize("prev, now, count, want", [
    (None, 10.0, 5, None),  # the first reading: no window
    ((10.0, 4), 12.0, 10, 3.0),  # (10 - 4) / (12 - 10) = 3 requests/s
    ((10.0, 4), 14.0, 4, 0.0),  # nothing new in 4 s
    ((10.0, 40), 12.0, 10, None),  # the count went down: the gateway restarted
    ((10.0, 4), 10.0, 10, None),  # the same instant
    ((10.0, 4), 10.0 + 301, 10, None),  # older than MAX_WINDOW_S (300 s): not a rate of now
])
def test_rate_between_two_readings(prev, now, count, want):
    got = ss.rate(prev, now, count)
    assert got == (pytest.approx(want) if want is not None else None)


def test_figures_and_all_gateways_together():
    a = scrape([0.03] * 4, [0.03] * 4)  # 4 requests at one gateway, 30 ms each
    b = scrape([0.2] * 4, [0.2] * 4)  # 4 at another, 200 ms each
    fa = ss.figures("g1", "http://a/v1", a, (0.0, 2.0), 1.0)  # (4 - 2) / 1 s = 2 requests/s
    fb = ss.figures("g2", "http://b/v1", b, None, 1.0)  # first reading: no rate
    assert (fa.requests, fa.rate, fb.requests, fb.rate) == (4, pytest.approx(2.0), 4, None)
    # merged buckets, 8 requests: p50's rank 4 is the top of (0.025, 0.05]'s 4: 0.05;
    # p95's rank 7.6 is 3.6 into (0.1, 0.25]'s 4: 0.1 + 0.15 x 3.6/4 = 0.235
    # (averaging the two gateways' own p95s, 0.0488 and 0.2425, would say 0.146: wrong)
    t = ss.total([fa, fb], [a, b])
    assert (t.gateway, t.requests, t.rate) == ("all", 8, pytest.approx(2.0))
    assert t.latency[0.5] == pytest.approx(0.05) and t.latency[0.95] == pytest.approx(0.235)
    assert t.ttft[0.95] == pytest.approx(0.235)


def test_a_gateway_that_does_not_answer_is_said_so():
    port = server_port()  # nothing listens there

    async def go():
        async with httpx.AsyncClient(timeout=ss.READ_S) as http:
            return await ss._other(http, f"http://127.0.0.1:{port}/v1", "chat", "")

    why = asyncio.run(go())
    assert isinstance(why, str) and why.startswith("did not answer"), why


def test_no_observation_gives_no_percentile():
    assert ss.percentiles(Histogram.of({0.1: 0.0})) == {0.5: None, 0.95: None, 0.99: None}
    assert ss.percentiles(None) == {0.5: None, 0.95: None, 0.99: None}
