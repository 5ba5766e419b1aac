"""Two control-plane workers, each with its own cached snapshot, place a burst while one host
joins and another leaves: their caches are stale by turns, and the ledger's check at reserve time
keeps every GPU within what it holds. Every replica converges. On SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest

from store import ledger, records
from gpuflow import ops
from tests.live import FAST, Live, spec
from tests.store_fixtures import PG_URL, pg_schema


@pytest.fixture(params=["sqlite", "postgresql"])
def store_args(request):
    """The store both workers share: a SQLite file (the workers meet at its file lock), or a
    fresh PostgreSQL schema (row locks, as several workers run at scale)."""
    if request.param == "sqlite":
        yield {}
        return
    schema, drop = pg_schema()
    yield {"database_url": PG_URL, "schema": schema}
    drop()


async def test_two_cached_control_planes_burst_while_hosts_join_and_leave(tmp_path, store_args):
    """20 deployments of 10 GiB; GPUs of 24 GiB hold 2 each. h1, h2 (2 GPUs each): 8 fit. h3
    (2 GPUs) joins during the burst: 12 fit. h1 dies (agent and processes SIGKILLed): 8 fit, on
    h2 and h3. At the end 8 RUNNING on h2/h3 with one ledger line each, 12 PENDING with reasons."""
    lv = await Live(str(tmp_path), **store_args).start({"h1": [24, 24], "h2": [24, 24]}, servers=2)
    try:
        names = [f"c{k:02d}" for k in range(20)]

        def never_overbooked():
            assert ledger.overbooked(lv.engine) == []

        burst = asyncio.gather(*(ops.deploy(lv.client, spec(n), FAST) for n in names))
        await asyncio.sleep(0.5)
        lv.add_host("h3", [24, 24])
        await burst
        await lv.wait(lambda: any(i.worker == "h3" and i.state == "running" for i in lv.instances()), 120,
                      "a replica RUNNING on h3", every=0.5, check=never_overbooked)
        lv.stack.kill_host("h1")

        def settled():
            rows = [i for i in lv.instances() if i.state != "deleted"]
            running = [i for i in rows if i.state == "running"]
            return len(rows) == 20 and all(i.state == "running" or (i.state == "pending" and i.reason) for i in rows) \
                and len(running) == 8 and {i.worker for i in running} <= {"h2", "h3"}

        await lv.wait(settled, 300, "8 RUNNING on h2/h3, 12 PENDING", every=0.5, check=never_overbooked)
        assert {w.name: w.state for w in records.workers(lv.engine)}["h1"] == "not_ready"
        per_gpu = ledger.booked_per_gpu(lv.engine)
        assert per_gpu == {(h, g): 20 * 2**30 for h in ("h2", "h3") for g in (0, 1)}  # 2 x 10 GiB on each GPU
        running = sorted(i.name for i in lv.instances() if i.state == "running")
        assert sorted(n for n in {k[0] for k in _lines(lv)}) == running  # held by the running ones only
    finally:
        lv.close()


def _lines(lv: Live) -> list[tuple[str, str]]:
    from sqlmodel import Session, select

    from store.tables import ReservationRow

    with Session(lv.engine) as s:
        return [(r.instance, r.worker) for r in s.exec(select(ReservationRow))]
