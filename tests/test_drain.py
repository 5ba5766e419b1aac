"""The drain wait (activities/drain.py) against the real store: gateways' in-flight reports
(report_load) hold it back, a zero is trusted only after the routing change had time to reach
every gateway, and the timeout bounds it."""

from __future__ import annotations

import asyncio
import time

import pytest

from activities.drain import wait_drained
from store import serving


@pytest.fixture
def engine(sqlite_engine):
    return sqlite_engine


def waiter(engine, instance: str, beats: list[int]):
    async def in_flight() -> int:
        return await asyncio.to_thread(serving.in_flight, engine, instance)

    async def gateways() -> int:
        return len(await asyncio.to_thread(serving.live_gateways, engine))

    return in_flight, gateways, beats.append


async def test_no_live_gateway_means_nothing_to_wait_for(engine):
    beats: list[int] = []
    started = time.monotonic()
    assert await wait_drained(*waiter(engine, "m-0", beats), timeout_s=30, seen_s=5) == 0
    assert beats == [] and time.monotonic() - started < 5  # returned before even the propagation wait


async def test_a_zero_is_trusted_only_after_every_gateway_had_time_to_see_the_change(engine):
    serving.report_load(engine, "gw-1", "http://g1/v1", {})  # live, nothing in flight anywhere
    beats: list[int] = []
    started = time.monotonic()
    assert await wait_drained(*waiter(engine, "m-0", beats), timeout_s=30, seen_s=1.0, poll_s=0.1) == 0
    assert time.monotonic() - started >= 1.0
    assert len(beats) >= 5 and set(beats) == {0}  # heartbeats all along: 1.0 s / 0.1 s polls


async def test_requests_in_flight_hold_the_drain_until_they_finish(engine):
    # two gateways: 2 + 1 requests on m-0, 4 on another instance (not ours)
    serving.report_load(engine, "gw-1", "http://g1/v1", {"m-0": 2, "m-1": 4})
    serving.report_load(engine, "gw-2", "http://g2/v1", {"m-0": 1})
    beats: list[int] = []

    async def finish():
        await asyncio.sleep(0.6)
        serving.report_load(engine, "gw-1", "http://g1/v1", {"m-1": 4})  # gw-1's two are done
        await asyncio.sleep(0.6)
        serving.report_load(engine, "gw-2", "http://g2/v1", {})  # and gw-2's one

    done = asyncio.ensure_future(finish())
    assert await wait_drained(*waiter(engine, "m-0", beats), timeout_s=30, seen_s=0.2, poll_s=0.1) == 0
    await done
    assert beats[0] == 3 and 1 in beats and beats[-1] == 0  # 2 + 1, then 1, then 0
    assert beats == sorted(beats, reverse=True)


async def test_the_timeout_bounds_the_wait(engine):
    serving.report_load(engine, "gw-1", "http://g1/v1", {"m-0": 1})  # a request that never ends
    beats: list[int] = []
    assert await wait_drained(*waiter(engine, "m-0", beats), timeout_s=0.5, seen_s=2, poll_s=0.1) == 1
    assert beats[-1] == 1


async def test_a_silent_gateway_no_longer_holds_the_drain(engine):
    from datetime import timedelta

    from store.tables import utcnow

    # its last report is older than LIVE_S (5 s): it is gone, its count no longer holds
    serving.report_load(engine, "gw-old", "http://old/v1", {"m-0": 3}, now=utcnow() - timedelta(seconds=60))
    assert await wait_drained(*waiter(engine, "m-0", []), timeout_s=30, seen_s=0.2) == 0
