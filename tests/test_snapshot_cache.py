"""The in-memory snapshot cache on a real SQLite file and a real PostgreSQL schema: after every
kind of store write, an incremental refresh equals a full load, and it reads only what changed."""

from __future__ import annotations

import pytest

from contracts.control import InstanceRecord
from activities.host_estimate import record_paths
from store import changes, ledger, records
from store.snapshot import load_snapshot
from store.snapshot_cache import SnapshotCache
from scheduler import occupancy
from scheduler.units import GiB
from tests.test_ledger import host, plan


def same(cache: SnapshotCache, engine) -> dict[str, int]:
    """The refreshed snapshot equals a full load, and so do the sums the cache derived for it."""
    snap, gens = cache.refresh(engine)
    full = load_snapshot(engine)
    assert snap.model_dump() == full.model_dump()
    derived, built = occupancy.of(snap), occupancy.of(full)
    assert derived is not built and derived.allocatable == built.allocatable
    assert derived.spread_counts("m") == built.spread_counts("m")
    return gens


# (write, worker rows read again, instance rows read again) after the first full load. A booking or
# a release moves its host's generation without touching the host's row: the row is not read again
# (its key, row_key, is: a narrow query), only the instance's.
STEPS = [
    ("a host joins", lambda e: records.upsert_worker(e, host("h2")), 1, 0),
    ("hosts read a local path: h1 has it, h2 looked (model files only)",
     lambda e: record_paths(e, "/models/m.gguf", ["h1"], ["h2"]), 0, 1),
    ("an instance is created", lambda e: records.create_instance(
        e, InstanceRecord(name="a-0", deployment="a", model="m", state="pending")), 0, 1),
    ("it is booked on h1: its row, and h1's generation (h1's row unchanged)",
     lambda e: ledger.reserve(e, "a-0", plan("h1", 0, 10)), 0, 1),
    ("a batch of a-0 (booked: kept) and a-1: one row, one change", lambda e: records.create_instances(e, [
        InstanceRecord(name=n, deployment="a", model="m", state="pending") for n in ("a-0", "a-1")]), 0, 1),
    ("it runs, with its model file on h1", lambda e: records.record_instance(e, InstanceRecord(
        name="a-0", deployment="a", model="m", state="running", worker="h1", gpu_indexes=[0],
        model_source="hf:o/m")), 0, 1),
    ("h2 goes not_ready", lambda e: records.set_worker_state(e, "h2", "not_ready", "lost"), 1, 0),
    ("h1 reports a third GPU: a new fingerprint", lambda e: records.upsert_worker(e, host("h1", gpus=3)), 1, 0),
    ("h1 reports the same again: no generation moved, nothing read", lambda e: records.upsert_worker(e, host("h1", gpus=3)),
     0, 0),
    ("h1 is cordoned", lambda e: records.cordon_worker(e, "h1", True, "disk"), 1, 0),
    ("a-0 drains: shown as stopping", lambda e: records.record_instance(e, InstanceRecord(
        name="a-0", deployment="a", model="m", state="draining", worker="h1", gpu_indexes=[0])), 0, 1),
    ("a-0 is released: h1's generation and a-0 (h1's row unchanged)", lambda e: ledger.release(e, "a-0"), 0, 1),
    ("a-0 is marked gone: it leaves the snapshot", lambda e: records.mark_gone(e, "a-0", "ended"), 0, 1),
    ("nothing", lambda e: None, 0, 0),
]


def test_incremental_refresh_equals_full_load(store):
    _, _, engine = store
    records.upsert_worker(engine, host("h1"))
    records.save_deployment(engine, "a", {"name": "a"}, 2)  # the deployment its replicas are booked for
    cache = SnapshotCache()
    same(cache, engine)
    assert cache.stats.full == 1
    for what, write, workers, instances in STEPS:
        before = (cache.stats.workers, cache.stats.instances)
        write(engine)
        gens = same(cache, engine)
        assert (cache.stats.workers - before[0], cache.stats.instances - before[1]) == (workers, instances), what
        assert gens == {w.name: w.generation for w in records.workers(engine)}, what
    assert cache.stats.full == 1  # never reloaded whole


def test_a_cache_behind_the_pruned_log_reloads_whole(store, monkeypatch):
    _, _, engine = store
    monkeypatch.setattr(changes, "KEEP", 3)
    monkeypatch.setattr(changes, "PRUNE_EVERY", 2)
    records.upsert_worker(engine, host("h1"))
    cache = SnapshotCache()
    same(cache, engine)
    for i in range(8):  # 8 changes; the log keeps the last 3 or so
        records.create_instance(engine, InstanceRecord(name=f"a-{i}", deployment="a", model="m", state="pending"))
    same(cache, engine)
    assert cache.stats.full == 2


def log_lines(engine) -> list[tuple[int, str, bool]]:
    from sqlmodel import Session, select
    with Session(engine) as s:
        return [tuple(r) for r in s.exec(select(changes.ChangeRow.seq, changes.ChangeRow.instance,
                                                changes.ChangeRow.files).order_by(changes.ChangeRow.seq))]


def test_bump_many_numbers_and_prunes_as_one_bump_each(store, monkeypatch):
    from sqlmodel import Session
    _, _, engine = store
    monkeypatch.setattr(changes, "KEEP", 3)
    monkeypatch.setattr(changes, "PRUNE_EVERY", 4)
    changes.ensure_counter(engine)  # a fresh store: the counter at 0
    # (the batch, the last number it returns, the log's numbers after it)
    steps = [
        # 1, 2 in the batch's order
        ([("a", False), ("b", True)], 2, [1, 2]),
        # none: the counter as it was
        ([], 2, [1, 2]),
        # 3, 4: 4 is a multiple of PRUNE_EVERY, so lines <= 4 - KEEP = 1 go
        ([("c", False), ("d", False)], 4, [2, 3, 4]),
        # 5, 6, 7: no multiple of 4 among them, nothing pruned
        ([("e", False), ("f", False), ("g", False)], 7, [2, 3, 4, 5, 6, 7]),
        # 8: a multiple of 4 again, lines <= 5 go
        ([("h", False)], 8, [6, 7, 8]),
    ]
    for batch, last, kept in steps:
        with Session(engine) as s:
            assert changes.bump_many(s, batch) == last
            s.commit()
        assert [seq for seq, _, _ in log_lines(engine)] == kept
    assert log_lines(engine)[-3:] == [(6, "f", False), (7, "g", False), (8, "h", False)]
    # the same log as one bump each: 9 and 10 one at a time, 11 and 12 in a batch (12 prunes <= 9)
    with Session(engine) as s:
        changes.bump(s, "i")
        changes.bump(s, "j", files=True)
        changes.bump_many(s, [("k", False), ("l", True)])
        s.commit()
    assert log_lines(engine) == [(10, "j", True), (11, "k", False), (12, "l", True)]


@pytest.mark.parametrize("n", [40])
def test_refreshes_racing_bookings_never_show_a_booking_without_its_generation(store, n):
    """Threads book while others refresh: every refresh's generations are no newer than what its
    snapshot shows (a booking it missed reads as a stale decision at reserve time)."""
    from concurrent.futures import ThreadPoolExecutor

    _, _, engine = store
    records.upsert_worker(engine, host("h1", gpus=8, gib=80))
    records.save_deployment(engine, "b", {"name": "b"}, n)
    cache = SnapshotCache()

    def book(i: int) -> None:
        records.create_instance(engine, InstanceRecord(name=f"b-{i}", deployment="b", model="m", state="pending"))
        ledger.reserve(engine, f"b-{i}", plan("h1", i % 8, 1, 0.1))

    def look(_: int) -> None:
        snap, gens = cache.refresh(engine)
        booked = sum(1 for i in snap.instances if i.worker == "h1")
        # each booking bumps h1's generation once, after upsert's first bump: gen - 1 bookings at least
        assert booked >= gens["h1"] - 1

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: book(i) if i % 2 == 0 else look(i), range(2 * n)))
    same(cache, engine)


def test_a_batch_of_first_rows_keeps_rows_written_since(store):
    """A retried start: the rows its workflows wrote since are kept; only the missing ones are
    inserted, in one transaction."""
    _, _, engine = store
    recs = [InstanceRecord(name=f"c-{i}", deployment="c", model="m", state="pending") for i in range(3)]
    assert records.create_instances(engine, recs[:1]) == ["c-0"]
    records.record_instance(engine, InstanceRecord(name="c-0", deployment="c", model="m", state="running"))
    assert records.create_instances(engine, recs) == ["c-1", "c-2"]  # c-0 is there already
    assert records.create_instances(engine, recs) == []  # all three are
    assert {r.name: r.state for r in records.instances_of(engine)} == {"c-0": "running", "c-1": "pending",
                                                                       "c-2": "pending"}


def test_an_assumed_placement_holds_its_gpu_until_the_store_shows_it_booked(store, monkeypatch):
    """The decide activity hands out a plan and assumes it: the next decision here sees that GPU
    taken although nothing is booked yet. The booking (a change to the instance) settles it: the
    store's row then says what it holds, and a release frees the GPU at once. An assumption never
    booked lapses after ASSUME_TTL_S."""
    import store.snapshot_cache as sc

    _, _, engine = store
    records.upsert_worker(engine, host("h1", gpus=2, gib=24))
    records.save_deployment(engine, "a", {"name": "a"}, 2)
    for n in ("a-0", "a-1"):
        records.create_instance(engine, InstanceRecord(name=n, deployment="a", model="m", state="pending"))
    cache = SnapshotCache()

    def held() -> dict[str, tuple[str | None, list[int]]]:
        snap, _ = cache.refresh(engine)
        return {i.name: (i.worker, list(i.gpu_indexes)) for i in snap.instances}

    def free_gpus() -> dict[int, int]:  # GiB free per GPU of h1, as the policy's sums see them
        snap, _ = cache.refresh(engine)
        return {i: v // GiB for i, v in occupancy.of(snap).allocatable["h1"].vram.items()}

    assert free_gpus() == {0: 24, 1: 24}
    cache.assume("a-0", "m", plan("h1", 0, 20))
    assert held()["a-0"] == ("h1", [0]) and free_gpus() == {0: 4, 1: 24}  # 24 - 20: taken before it is booked
    assert cache.assumed() == ["a-0"]
    ledger.reserve(engine, "a-0", plan("h1", 0, 20))
    assert free_gpus() == {0: 4, 1: 24} and cache.assumed() == []  # booked: the store's row now holds it
    ledger.release(engine, "a-0")
    assert free_gpus() == {0: 24, 1: 24}  # released: nothing assumed lingers

    clock = [1000.0]
    monkeypatch.setattr(sc.time, "monotonic", lambda: clock[0])
    cache.assume("a-1", "m", plan("h1", 1, 10))
    assert free_gpus() == {0: 24, 1: 14}
    clock[0] += sc.ASSUME_TTL_S + 1  # never booked (its booking failed, its workflow went away)
    assert free_gpus() == {0: 24, 1: 24} and cache.assumed() == []


def test_a_replica_never_waits_on_capacity_that_is_only_promised(store):
    """One GPU; a-0's decision assumes it. a-1 decided next does not fit beside that promise, so it
    is decided again on the store alone and gets the GPU too (a promise may fail: waiting PENDING on
    it could wait for a wake that never comes). Whichever books second is refused by the ledger and
    decides again; once a-0 is booked, a-1 does not fit, and says so."""
    from activities.decider import Decider
    from activities.estimate_cache import EstimateCache
    from activities.metrics import ControlMetrics
    from store import db
    from scheduler.policy_config import PolicyConfig
    from scheduler.spec import ModelSpec

    _, _, engine = store
    records.upsert_worker(engine, host("h1", gpus=1, gib=24))
    raw = {"name": "a", "backend": "custom", "run_command": "x {port}", "source": {"local_path": "/m/a"},
           "resources": {"vram": 20 * GiB, "ram": GiB}}
    records.save_deployment(engine, "a", raw, 2)
    for n in ("a-0", "a-1"):
        records.create_instance(engine, InstanceRecord(name=n, deployment="a", model="a", state="pending"))
    decider = Decider(engine, db.reader(engine), SnapshotCache(), PolicyConfig(), ControlMetrics())
    spec = ModelSpec.model_validate(raw)
    req = EstimateCache().get(spec)
    first = decider.decide("a-0", spec, req)
    assert first.scheduled and first.plan.gpu_indexes == [0] and decider.snapshots.assumed() == ["a-0"]
    second = decider.decide("a-1", spec, req)  # 20 + 20 > 24 beside the promise; the store alone: it fits
    assert second.scheduled and second.plan.gpu_indexes == [0]
    ledger.reserve(engine, "a-0", first.plan)
    with pytest.raises(ledger.StaleDecision):
        ledger.reserve(engine, "a-1", second.plan)
    third = decider.decide("a-1", spec, req)
    assert not third.scheduled and any("GPU" in r or "fit" in r for r in third.reasons), third.reasons
    assert decider.snapshots.assumed() == []  # a-0 booked (seen by the refresh), a-1 not placed: nothing assumed
