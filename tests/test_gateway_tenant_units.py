"""The gateway's per-tenant admission (gateway/tenant_limits.py: a token bucket for
requests_per_s, a count for max_concurrent, ``now`` passed in) and its queue served by tenant
priority, then arrival (gateway/balance.py)."""

from __future__ import annotations

import asyncio
import json

import pytest

from store.serving import Route
from gateway import errors
from gateway.balance import Balancer
from gateway.table import build
from gateway.tenant_limits import MAX_CONCURRENT as MC, REQUESTS_PER_S as RPS, Limits, Refusal, Rule, rules_of
from gateway.auth import ANONYMOUS
from scheduler.tenancy.config import TenantsFile

RULES = {
    "prod": Rule(priority=100, max_concurrent=2),
    "dev": Rule(priority=30, requests_per_s=2.0),
    "poc": Rule(priority=10, requests_per_s=0.5, max_concurrent=1),
    "default": Rule(requests_per_s=1.0),
}
OK = None


# Each step: (now, tenant, "admit" and what it gives: OK or (reason, retry-after s)) or (now, tenant, "done").
@pytest.mark.parametrize("steps", [
    pytest.param([  # dev: 2 a second, burst max(1, 2) = 2
        (0.0, "dev", OK), (0.0, "dev", OK),  # the bucket starts full: 2 -> 1 -> 0
        (0.0, "dev", (RPS, 0.5)),  # 0 tokens: one more in (1 - 0) / 2 = 0.5 s
        (0.25, "dev", (RPS, 0.25)),  # 0.25 s * 2/s = 0.5 tokens: (1 - 0.5) / 2 = 0.25 s
        (0.5, "dev", OK),  # 1 token
        (10.0, "dev", OK), (10.0, "dev", OK), (10.0, "dev", (RPS, 0.5)),  # idle 9.5 s: still only 2 at once
    ], id="requests_per_s-token-bucket"),
    pytest.param([  # poc: 0.5 a second (burst max(1, 0.5) = 1) and 1 at a time
        (0.0, "poc", OK),  # 1 -> 0 tokens, 1 in flight
        (0.0, "poc", (MC, 1.0)),  # 1 in flight already: refused, and no token spent on it
        (0.0, "poc", "done"),
        (1.0, "poc", (RPS, 1.0)),  # 1 s * 0.5/s = 0.5 token: (1 - 0.5) / 0.5 = 1 s
        (2.0, "poc", OK),
    ], id="max_concurrent-checked-first"),
    pytest.param([  # prod: 2 at a time, no rate
        (0.0, "prod", OK), (0.0, "prod", OK), (0.0, "prod", (MC, 1.0)),
        (0.1, "prod", "done"), (0.1, "prod", OK),  # one ended: room for one
        (0.1, "dev", OK),  # another tenant is not affected
    ], id="max_concurrent"),
    pytest.param([  # an open gateway's requests are tenant default (1 a second)
        (0.0, ANONYMOUS, OK), (0.0, ANONYMOUS, ("default", RPS, 1.0)), (0.0, "default", (RPS, 1.0)),
    ], id="anonymous-is-default"),
    pytest.param([(0.0, "team-x", OK)] * 50, id="unnamed-tenant-unlimited"),
])
def test_admission(steps):
    lim = Limits(RULES, now=0.0)
    for now, tenant, want in steps:
        if want == "done":
            lim.done(tenant)
            continue
        got = lim.admit(tenant, now)
        if want is OK:
            assert got is None, (now, tenant, got)
            continue
        name, reason, after = want if len(want) == 3 else (tenant, *want)
        assert got is not None, (now, tenant)
        assert (got.tenant, got.reason) == (name, reason) and got.retry_after_s == pytest.approx(after)


def test_a_new_file_keeps_unchanged_buckets_and_counts_in_flight():
    lim = Limits(RULES, now=0.0)
    for _ in range(2):
        assert lim.admit("dev", 0.0) is None  # dev's bucket empty
    assert lim.admit("prod", 0.0) is None and lim.admit("prod", 0.0) is None  # prod 2 of 2
    lim.set_rules(dict(RULES), now=0.0)  # the same file again: nothing refilled, nothing forgotten
    assert lim.admit("dev", 0.0).reason == RPS and lim.admit("prod", 0.0).reason == MC
    lim.set_rules({**RULES, "dev": Rule(30, requests_per_s=4.0), "prod": Rule(100, max_concurrent=3)}, now=0.0)
    assert [lim.admit("dev", 0.0) for _ in range(4)] == [None] * 4  # a new rate: a full bucket of 4
    assert lim.admit("prod", 0.0) is None and lim.admit("prod", 0.0).reason == MC  # 2 in flight + 1 = 3
    lim.set_rules({}, now=0.0)  # no file: no limits, everything priority 0
    assert lim.admit("dev", 0.0) is None and lim.priority("prod") == 0


def test_rules_come_from_the_tenants_file():
    tf = TenantsFile.model_validate({"tenants": [
        {"name": "prod", "priority": 100, "max_concurrent": 8},
        {"name": "dev", "priority": 30, "requests_per_s": 2.5, "limit": {"gpus": 4}},
    ]})
    assert rules_of(tf) == {"prod": Rule(100, None, 8), "dev": Rule(30, 2.5, None)}
    assert Limits(rules_of(tf)).priority("prod") == 100 and Limits(rules_of(tf)).priority("anonymous") == 0


@pytest.mark.parametrize("reason,after,header,code,words", [
    (RPS, 0.25, "1", "rate_limit_exceeded", "limit of 2 requests per second"),  # ceil(0.25) = 1
    (RPS, 2.5, "3", "rate_limit_exceeded", "retry in 3 s"),  # ceil(2.5) = 3
    (MC, 1.0, "1", "concurrency_limit_exceeded", "already has 2 requests in flight"),
])
def test_refusal_is_a_429_naming_the_tenant_and_the_limit(reason, after, header, code, words):
    ref = Refusal("dev", reason, 2.0 if reason == RPS else 2, after)
    r = errors.tenant_limit(ref.message, ref.reason, ref.retry_after_s)
    body = json.loads(r.body)["error"]
    assert r.status_code == 429 and r.headers["retry-after"] == header
    assert body["type"] == "rate_limit_error" and body["code"] == code
    assert "'dev'" in body["message"] and words in body["message"] and reason in body["message"]


def route(i: str) -> Route:
    return Route(instance=i, deployment="m", address="127.0.0.1", port=1)


# One replica, one slot, held; requests queue as (name, priority, arrival); the slot is then
# released one request at a time: the order they are served in.
@pytest.mark.parametrize("queued,served", [
    ([("a", 0, 1), ("b", 100, 2), ("c", 30, 3), ("d", 100, 4), ("e", 0, 5)], "bdcae"),  # priority, then arrival
    ([("a", 0, 1), ("b", 0, 2), ("c", 0, 3)], "abc"),  # one priority: first come, first served
    # x is a retry: it arrived at t=1.5, before b and c, and keeps that place within its priority
    ([("a", 10, 1), ("b", 10, 2), ("c", 50, 3), ("x", 10, 1.5)], "caxb"),
    ([("a", -5, 1), ("b", 0, 2)], "ba"),  # negative priority goes after the default 0
])
async def test_queue_serves_by_priority_then_arrival(queued, served):
    b = Balancer(queue_timeout_s=5, max_queue=10, bad_s=5)
    b.swap(build([route("r")], {"m": {"max_concurrency": 1}}, 4))
    held, _ = await b.acquire("m")
    order: list[str] = []

    async def wait(name, priority, arrival):
        got, _ = await b.acquire("m", priority=priority, arrival=arrival)
        order.append(name)
        await asyncio.sleep(0)
        b.release(got, "m")  # done: the next in line gets the slot

    tasks = []
    for q in queued:
        tasks.append(asyncio.create_task(wait(*q)))
        await asyncio.sleep(0)  # each is queued before the next asks
    assert b.depth("m") == len(queued)
    b.release(held, "m")
    await asyncio.gather(*tasks)
    assert "".join(order) == served


async def test_a_retry_that_cannot_use_the_free_replica_does_not_hold_back_lower_priorities():
    b = Balancer(queue_timeout_s=5, max_queue=10, bad_s=5)
    b.swap(build([route("a")], {"m": {"max_concurrency": 1}}, 4))
    held, _ = await b.acquire("m")
    retry = asyncio.create_task(b.acquire("m", exclude=frozenset({"a"}), priority=100, arrival=0.0))  # a failed it
    low = asyncio.create_task(b.acquire("m", priority=-1))
    await asyncio.sleep(0)
    b.release(held, "m")  # the retry is first in line but excluded a: the low-priority request takes it
    assert (await low)[0].instance == "a" and not retry.done()
    b.swap(build([route("a"), route("b")], {"m": {"max_concurrency": 1}}, 4))
    assert (await retry)[0].instance == "b"


# max_queue 2, full with (name, priority) in line; a newcomer of ``priority`` arrives: who is refused.
@pytest.mark.parametrize("line,priority,refused", [
    ([("a", 0), ("b", 0)], 0, "new"),  # same priority: the newcomer waits nowhere
    ([("a", 10), ("b", 0)], 5, "b"),  # b (0) is below the newcomer (5): b leaves, the newcomer is in line
    ([("a", 0), ("b", 0)], 100, "b"),  # of equals, the newest leaves
    ([("a", 10), ("b", 10)], 5, "new"),  # everyone in line outranks it
])
async def test_a_full_queue_makes_room_only_for_a_higher_priority(line, priority, refused):
    from gateway.balance import QueueFull

    b = Balancer(queue_timeout_s=5, max_queue=2, bad_s=5)
    b.swap(build([route("r")], {"m": {"max_concurrency": 1}}, 4))
    await b.acquire("m")  # holds the only slot
    waiting = {}
    for name, p in line:
        waiting[name] = asyncio.create_task(b.acquire("m", priority=p))
        await asyncio.sleep(0)
    new = asyncio.create_task(b.acquire("m", priority=priority))
    await asyncio.sleep(0)
    waiting["new"] = new
    with pytest.raises(QueueFull):
        await waiting.pop(refused)
    assert b.depth("m") == 2 and not any(t.done() for t in waiting.values())
    for t in waiting.values():
        t.cancel()
    await asyncio.gather(*waiting.values(), return_exceptions=True)
    assert b.depth("m") == 0


def test_the_refresh_loop_parses_the_tenants_file_only_when_its_version_moved(tmp_path):
    from store import db, tenants
    from gateway.refresh import load_tenants

    engine = db.make_engine(db.sqlite_url(str(tmp_path / "gpuflow.db")))
    db.init_db(engine)
    assert load_tenants(engine, None) == (0, {})  # nothing applied yet: version 0, no rules
    assert load_tenants(engine, 0) is None  # unchanged: nothing parsed
    tenants.apply(engine, TenantsFile.model_validate({"tenants": [{"name": "dev", "requests_per_s": 2}]}))
    assert load_tenants(engine, 0) == (1, {"dev": Rule(0, 2.0, None)})
    assert load_tenants(engine, 1) is None
    engine.dispose()
