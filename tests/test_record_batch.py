"""Group commit of instance rows (activities/record_batch.py) against a real store: writes that
arrive while one is being written go in together, in arrival order; a batch that fails is written
one by one, so only the record at fault fails."""

from __future__ import annotations

import asyncio

import pytest

from contracts.control import InstanceRecord
from activities.record_batch import RecordBatch
from store import records


def rec(name: str, state: str = "starting", worker: str | None = "h1") -> InstanceRecord:
    return InstanceRecord(name=name, deployment="m", model="m", state=state, worker=worker, gpu_indexes=[0])


@pytest.fixture
def engine(sqlite_engine):
    return sqlite_engine


def batcher(engine, calls: list[list[str]], fail_on: str | None = None):
    async def write(recs):
        calls.append([r.name for r in recs])
        if fail_on in {r.name for r in recs}:
            raise ValueError(f"cannot write {fail_on}")
        await asyncio.sleep(0.05)  # a write that takes a while: later records queue behind it
        records.record_instances(engine, recs)

    return RecordBatch(write)


@pytest.mark.parametrize("waves, expected_calls", [
    ([1], [["m-0"]]),  # alone: written at once, no wait for company
    ([5], [["m-0", "m-1", "m-2", "m-3", "m-4"]]),  # made in one turn of the loop: one transaction
    # 1 begins a batch; the 4 that arrive while it is written (50 ms) go in together after it
    ([1, 4], [["m-0"], ["m-1", "m-2", "m-3", "m-4"]]),
    # waves at 0, 10 and 20 ms: the second and third both arrive while the first is written
    ([2, 1, 3], [["m-0", "m-1"], ["m-2", "m-3", "m-4", "m-5"]]),
])
def test_writes_arriving_together_share_a_transaction(engine, waves, expected_calls):
    calls: list[list[str]] = []

    async def go():
        b = batcher(engine, calls)
        futs, k = [], 0
        for n in waves:
            futs += [b.record(rec(f"m-{k + i}")) for i in range(n)]
            k += n
            await asyncio.sleep(0.01)  # the wave's batch has begun: the next wave arrives while it is written
        await asyncio.gather(*futs)

    asyncio.run(go())
    assert calls == expected_calls
    n = sum(waves)
    assert {r.name: r.state for r in records.instances_of(engine)} == {f"m-{i}": "starting" for i in range(n)}


def test_order_within_a_batch_is_arrival_order(engine):
    calls: list[list[str]] = []

    async def go():
        b = batcher(engine, calls)
        await asyncio.gather(b.record(rec("m-0", "scheduled")), b.record(rec("m-1", "starting")),
                             b.record(rec("m-1", "running")))

    asyncio.run(go())
    assert calls == [["m-0", "m-1", "m-1"]]
    assert {r.name: r.state for r in records.instances_of(engine)} == {"m-0": "scheduled", "m-1": "running"}


def test_a_failing_batch_is_written_one_by_one_and_fails_only_the_bad_record(engine):
    calls: list[list[str]] = []

    async def go():
        b = batcher(engine, calls, fail_on="m-1")
        return await asyncio.gather(*(b.record(rec(f"m-{i}")) for i in range(3)), return_exceptions=True)

    got = asyncio.run(go())
    assert [type(x).__name__ for x in got] == ["NoneType", "ValueError", "NoneType"]
    assert "cannot write m-1" in str(got[1])
    # the batch of three failed as a whole, then each was tried alone
    assert calls == [["m-0", "m-1", "m-2"], ["m-0"], ["m-1"], ["m-2"]]
    assert sorted(r.name for r in records.instances_of(engine)) == ["m-0", "m-2"]


def test_a_cancelled_write_that_has_not_begun_is_dropped(engine):
    calls: list[list[str]] = []

    async def go():
        b = batcher(engine, calls)
        first = b.record(rec("m-0"))
        await asyncio.sleep(0.01)  # m-0's batch is being written
        dropped, kept = b.record(rec("m-1")), b.record(rec("m-2"))
        dropped.cancel()
        await asyncio.gather(first, kept)

    asyncio.run(go())
    assert calls == [["m-0"], ["m-2"]]
    assert sorted(r.name for r in records.instances_of(engine)) == ["m-0", "m-2"]
