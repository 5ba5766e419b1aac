"""The reservation ledger on a real SQLite file and a real PostgreSQL schema: idempotent reserve
and release, stale plans rejected, and no overbooking under concurrent threads and processes."""

from __future__ import annotations

import multiprocessing as mp
import re
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from contracts.control import HostReport, PlacementPlan
from store import db, ledger, records
from store.snapshot import load_snapshot
from scheduler.cluster import GPU
from scheduler.units import GiB
from tests.store_fixtures import want



def host(name: str, gpus: int = 2, gib: int = 24, reserve_vram: int = 0, ram: int = 64) -> HostReport:
    return HostReport(name=name, ram_total=ram * GiB, reserved_vram=reserve_vram * GiB,
                      gpus=[GPU(index=i, vram_total=gib * GiB) for i in range(gpus)], simulated=True)


def plan(worker: str, gpu: int, vram_gib: float, ram_gib: float = 1) -> PlacementPlan:
    return PlacementPlan(worker=worker, gpu_indexes=[gpu],
                         claim={"vram": {gpu: int(vram_gib * GiB)}, "ram": int(ram_gib * GiB)})


def test_reserve_is_idempotent_and_release_symmetric(store):
    _, _, engine = store
    records.upsert_worker(engine, host("h1"))
    want(engine, "a-0")
    assert ledger.reserve(engine, "a-0", plan("h1", 0, 10))[1] is True
    assert ledger.reserve(engine, "a-0", plan("h1", 0, 10))[1] is False  # same plan again: books once
    assert ledger.booked_per_gpu(engine) == {("h1", 0): 10 * GiB}
    assert ledger.release(engine, "a-0") == 1
    assert ledger.release(engine, "a-0") == 0  # twice: no-op
    assert ledger.release(engine, "never") == 0  # never reserved: no-op
    assert ledger.booked_per_gpu(engine) == {}


def test_a_plan_from_a_moved_snapshot_that_still_fits_is_booked_as_it_is(store):
    """The workers moved on since the decision (another booking, an inventory report): the plan is
    booked as decided while it still fits (the check guards capacity, not the generation), once."""
    _, _, engine = store
    records.upsert_worker(engine, host("h1"))
    want(engine, "a-0", "b-0")
    decided = plan("h1", 0, 10)
    records.upsert_worker(engine, host("h1", gpus=2, gib=48))  # the inventory moved: generations bumped
    ledger.reserve(engine, "b-0", plan("h1", 1, 10))  # and a booking on the other GPU
    assert ledger.reserve(engine, "a-0", decided) == (decided, True)
    assert ledger.reserve(engine, "a-0", decided) == (decided, False)  # the retry: held already
    assert ledger.booked_per_gpu(engine) == {("h1", 0): 10 * GiB, ("h1", 1): 10 * GiB}  # each held once


def test_a_new_plan_replaces_the_held_lines_even_on_the_same_gpu(store):
    """An instance placed again (its host was lost, its plan changed) books over what it held: the
    old lines go before the new ones come, even on the same GPU (one unique key per instance,
    worker and GPU; an INSERT flushed before the DELETE failed here forever)."""
    _, _, engine = store
    records.upsert_worker(engine, host("h1", gpus=2, gib=48))
    want(engine, "a-0")
    ledger.reserve(engine, "a-0", plan("h1", 0, 30))
    again = plan("h1", 0, 40)  # the same GPU of 48 GiB: 30 + 40 > 48, so it fits only in place of its own 30
    assert ledger.reserve(engine, "a-0", again) == (again, True)
    assert ledger.booked_per_gpu(engine) == {("h1", 0): 40 * GiB}


@pytest.mark.parametrize("first,second,fits", [
    (10, 14, True),    # 10 + 14 = 24 GiB = the whole card
    (10, 14.5, False),  # 10 + 14.5 = 24.5 > 24
    (20, 4.5, False),  # 20 + 4.5 > 24
])
def test_stale_plan_rejected_with_numbers(store, first, second, fits):
    _, _, engine = store
    records.upsert_worker(engine, host("h1"))
    want(engine, "a-0", "a-1")
    ledger.reserve(engine, "a-0", plan("h1", 0, first))
    if fits:
        assert ledger.reserve(engine, "a-1", plan("h1", 0, second))
    else:
        with pytest.raises(ledger.StaleDecision, match=r"h1 GPU 0: needs .* GiB free"):
            ledger.reserve(engine, "a-1", plan("h1", 0, second))
        assert ledger.booked_per_gpu(engine) == {("h1", 0): int(first * GiB)}


def test_a_batch_books_what_fits_as_the_bookings_before_it_left_the_ledger(store):
    """reserve_many: one transaction; each plan is checked against the ledger with the batch's
    earlier bookings in it. h1 has two 24 GiB GPUs: a-0 takes 20 of GPU 0, so b-0's 10 there no
    longer fits (20 + 10 > 24) and fails alone, nothing of it written; c-0 on GPU 1 and a-0 again
    (held already: not booked now) go through. Each worker's generation moves once."""
    _, _, engine = store
    records.upsert_worker(engine, host("h1"))
    records.upsert_worker(engine, host("h2"))
    want(engine, "a-0", "b-0", "c-0")
    gen0 = {w.name: w.generation for w in records.workers(engine)}
    got = ledger.reserve_many(engine, [ledger.Booking("a-0", plan("h1", 0, 20)), ledger.Booking("b-0", plan("h1", 0, 10)),
                                       ledger.Booking("c-0", plan("h1", 1, 10)), ledger.Booking("a-0", plan("h1", 0, 20))])
    assert [g[1] if isinstance(g, tuple) else type(g).__name__ for g in got] == [True, "StaleDecision", True, False]
    assert "GPU 0: needs 10.0 GiB, 4.0 GiB free" in str(got[1])
    assert ledger.booked_per_gpu(engine) == {("h1", 0): 20 * GiB, ("h1", 1): 10 * GiB}
    gen1 = {w.name: w.generation for w in records.workers(engine)}
    assert (gen1["h1"] - gen0["h1"], gen1["h2"] - gen0["h2"]) == (1, 0)


def test_system_reserve_and_worker_state_are_checked(store):
    _, _, engine = store
    records.upsert_worker(engine, host("h1", reserve_vram=2))  # 24 - 2 = 22 GiB bookable per GPU
    want(engine, "a-0")
    with pytest.raises(ledger.StaleDecision, match="needs 23"):
        ledger.reserve(engine, "a-0", plan("h1", 0, 23))
    records.set_worker_state(engine, "h1", "not_ready", "missed heartbeats")
    with pytest.raises(ledger.StaleDecision, match="h1 is not_ready"):
        ledger.reserve(engine, "a-0", plan("h1", 0, 1))
    with pytest.raises(ledger.StaleDecision, match="ghost is not in the store"):
        ledger.reserve(engine, "a-0", plan("ghost", 0, 1))


def test_snapshot_shows_reserved_claims(store):
    _, _, engine = store
    records.upsert_worker(engine, host("h1"))
    from contracts.control import InstanceRecord

    want(engine, "m-0")
    records.record_instance(engine, InstanceRecord(name="m-0", deployment="m", model="m", state="pending"))
    ledger.reserve(engine, "m-0", plan("h1", 1, 8))
    snap = load_snapshot(engine)
    (i,) = snap.instances
    assert (i.worker, i.gpu_indexes, i.claim.vram, i.state.value) == ("h1", [1], {1: 8 * GiB}, "scheduled")
    ledger.release(engine, "m-0")
    assert load_snapshot(engine).instances[0].worker is None  # released: claims nothing


def _attempts(n: int, seed: int) -> list[tuple[str, PlacementPlan]]:
    rnd = random.Random(seed)
    return [(f"i{seed}-{k}", plan(rnd.choice(["h1", "h2"]), rnd.randrange(2), rnd.choice([5, 7, 9]), 2))
            for k in range(n)]


def _try_all(engine, attempts) -> int:
    ok = 0
    for name, p in attempts:
        try:
            ok += ledger.reserve(engine, name, p)[1]
        except ledger.StaleDecision:
            pass
    return ok


def _process_main(url, schema, seed, q):
    engine = db.make_engine(url, schema=schema)
    q.put(_try_all(engine, _attempts(40, seed)))
    engine.dispose()


def test_no_overbooking_under_concurrency(store):
    """8 threads and 4 processes race 480 reservations onto 2 workers x 2 GPUs x 24 GiB (RAM
    64 GiB, 2 GiB per reservation, so RAM caps a worker at 32 reservations). Whatever wins,
    no GPU and no worker is booked beyond its size, and the ledger holds exactly the winners."""
    url, schema, engine = store
    for h in ("h1", "h2"):
        records.upsert_worker(engine, host(h))
    want(engine, *[name for seed in [*range(8), *range(100, 104)] for name, _ in _attempts(40, seed)])
    with ThreadPoolExecutor(8) as ex:
        won = sum(ex.map(lambda s: _try_all(engine, _attempts(40, s)), range(8)))
    q = mp.get_context("spawn").Queue()
    procs = [mp.get_context("spawn").Process(target=_process_main, args=(url, schema, 100 + s, q)) for s in range(4)]
    for p in procs:
        p.start()
    won += sum(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    assert ledger.overbooked(engine) == []
    from sqlmodel import Session, func, select

    from store.tables import ReservationRow

    with Session(engine) as s:
        assert s.exec(select(func.count()).select_from(ReservationRow)).one() == won
    per_gpu = ledger.booked_per_gpu(engine)
    assert won >= 8  # every GPU takes at least two 9 GiB plans: the race did not starve everyone
    assert all(b <= 24 * GiB for b in per_gpu.values())


def _own_row(engine, name: str) -> None:  # a workflow's own first record: what an instance started by hand writes
    from contracts.control import InstanceRecord

    records.record_instance(engine, InstanceRecord(name=name, deployment=name.rsplit("-", 1)[0], model="m",
                                                   state="analyzing"))


def _deleted(engine, name: str) -> None:  # its workflow's teardown
    from contracts.control import InstanceRecord

    records.record_instance(engine, InstanceRecord(name=name, deployment=name.rsplit("-", 1)[0], model="m",
                                                   state="deleted"))


def _pre_upgrade(engine, name: str) -> None:  # a row made before the wanted column: NULL, left running
    from sqlalchemy import update

    from store.tables import InstanceRow

    want(engine, name)
    with engine.begin() as c:
        c.execute(update(InstanceRow.__table__).where(InstanceRow.__table__.c.name == name).values(wanted=None))


@pytest.mark.parametrize("setup, name, refused", [
    (lambda e: None, "m-0", "instance m-0 was not started by a deployment"),  # M2, the quick path: no row at all
    (lambda e: (records.save_deployment(e, "m", {"name": "m"}, 1), _own_row(e, "m-9")),
     "m-9", "instance m-9 was not started by its deployment m (it was started by hand)"),  # M2: its own row
    (lambda e: (want(e, "m-0"), _deleted(e, "m-0")), "m-0", "instance m-0 of deployment m was deleted"),
    (lambda e: (want(e, "m-0"), _deleted(e, "m-0"), _own_row(e, "m-0")),
     "m-0", "was not started by its deployment m"),  # a deleted replica's name, revived by hand: still not wanted
    (lambda e: (records.save_deployment(e, "m", {"name": "m"}, 2), _own_row(e, "m-1"), want(e, "m-1")),
     "m-1", "was not started by its deployment m"),  # started by hand just before its deployment would have
    (lambda e: (want(e, "m-0"), records.save_deployment(e, "m", {}, 1, "deleting")), "m-0",
     "its deployment m is deleting"),
    (lambda e: (want(e, "m-0"), records.save_deployment(e, "m", {}, 0, "deleted")), "m-0", "its deployment m is deleted"),
    (lambda e: records.create_instances(e, [_rec("gone-0", "gone")]), "gone-0", "its deployment gone does not exist"),
    (lambda e: (records.save_deployment(e, "other", {}, 1), records.create_instances(e, [_rec("m-0", "other")])),
     "m-0", "is not one of deployment other's (they are named other-<n>)"),
    (lambda e: want(e, "m-0"), "m-0", None),  # its deployment started it and is active: booked
    (lambda e: _pre_upgrade(e, "m-0"), "m-0", None),  # a row from before the column: kept as it was
    (lambda e: (want(e, "m-0"), _deleted(e, "m-0"), want(e, "m-0")), "m-0", None),  # deployed again after a delete
])
def test_only_a_replica_its_deployment_wants_is_booked(store, setup, name, refused):
    """At the ledger, not only at the agent (issue 40, M2 and M3): an instance workflow started by
    hand, or continued as new into from one's own, is booked like any replica before this rule."""
    _, _, engine = store
    records.upsert_worker(engine, host("h1"))
    setup(engine)
    if refused is None:
        assert ledger.reserve(engine, name, plan("h1", 0, 10))[1] is True
        return
    with pytest.raises(ledger.NotWanted, match=re.escape(refused)):
        ledger.reserve(engine, name, plan("h1", 0, 10))
    with pytest.raises(ledger.NotWanted, match=re.escape(refused)):  # nor by preemption
        ledger.preempt(engine, name, plan("h1", 0, 10), {}, "x")
    assert ledger.booked_per_gpu(engine) == {}  # nothing of it written


def _rec(name: str, deployment: str):
    from contracts.control import InstanceRecord

    return InstanceRecord(name=name, deployment=deployment, model=deployment, state="pending")
