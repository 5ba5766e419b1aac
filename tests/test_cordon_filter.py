"""The cordon filter: a cordoned host gets no new replica, its reason names it, it runs after the
status filter, and a cluster without a cordon decides and records what it did before cordons."""

import pytest

from scheduler.cluster import Worker
from scheduler.decide import decide
from scheduler.request import FlatRequest
from scheduler.spec import ModelSpec
from scheduler.units import GiB
from store.snapshot import worker_model
from store.tables import WorkerRow
from tests.conftest import cluster, gpu, inst, worker

REQ = FlatRequest(vram=4 * GiB, ram=GiB)
SPEC = ModelSpec(name="m", source={"huggingface": {"repo": "o/m"}}, backend="custom", run_command="x",
                 placement_strategy="binpack")


def hosts(cordoned: str, down: str = "") -> list[Worker]:
    """sim-1, sim-2, sim-3, each one 24 GiB GPU; ``cordoned``/``down``: which are (by digit)."""
    return [worker(f"sim-{i}", 64, [gpu(0, 24)], cordoned=str(i) in cordoned,
                   state="not_ready" if str(i) in down else "ready") for i in (1, 2, 3)]


# Binpack prefers the fuller GPU: sim-2 holds a 16 GiB replica, so 16 + 4 = 20 of 24
# GiB makes it the best fit whenever it is not cordoned.
@pytest.mark.parametrize("cordoned,down,placed,removed,note", [
    ("", "", "sim-2", None, None),  # no cordon: the filter does not run, and is not recorded
    ("2", "", "sim-1", {"sim-2"}, "host sim-2 is cordoned."),  # the best fit is cordoned: the next one
    ("12", "", "sim-3", {"sim-1", "sim-2"}, "hosts sim-1, sim-2 are cordoned."),
    ("123", "", None, {"sim-1", "sim-2", "sim-3"}, "hosts sim-1, sim-2, sim-3 are cordoned."),
    # after the status filter: a NOT_READY host is the status filter's, not the cordon's, to name
    ("13", "1", "sim-2", {"sim-3"}, "host sim-3 is cordoned."),
])
def test_cordoned_hosts_get_no_new_replica(cordoned, down, placed, removed, note):
    snap = cluster(hosts(cordoned, down), [inst("old-0", "old", "sim-2", [0], vram={0: 16 * GiB})])
    d = decide(snap, SPEC, REQ)
    names = [v.name for v in d.filters]
    assert (d.placement.worker if d.scheduled else None) == placed
    if removed is None:
        assert "cordon" not in names
        return
    assert names.index("cordon") == names.index("status") + 1
    v = next(v for v in d.filters if v.name == "cordon")
    assert set(v.removed) == removed and v.note == note
    assert v.removed[sorted(removed)[0]] == [
        f"no new replicas here until 'gpuflow hosts uncordon {sorted(removed)[0]}'"]


def test_every_host_cordoned_is_the_pending_reason():
    """The filter that left no worker decides: its summary leads the reasons, then each host's line."""
    d = decide(cluster(hosts("13", down="2")), SPEC, REQ)
    assert not d.scheduled
    assert d.reasons[:d.decisive] == [
        "hosts sim-1, sim-3 are cordoned.",
        "cordon: worker sim-1: no new replicas here until 'gpuflow hosts uncordon sim-1'",
        "cordon: worker sim-3: no new replicas here until 'gpuflow hosts uncordon sim-3'"]


def test_the_summary_names_three_hosts_and_counts_the_rest():
    ws = [worker(f"sim-{i}", 64, [gpu(0, 24)], cordoned=True) for i in range(1, 6)]
    d = decide(cluster(ws), SPEC, REQ)
    assert d.reasons[0] == "hosts sim-1, sim-2, sim-3 (+2 more) are cordoned."  # 5 cordoned - 3 named = 2


def test_a_replica_running_on_a_cordoned_host_keeps_its_claim():
    """Re-deciding another replica counts old-0's 16 GiB on cordoned sim-1 still: the cordon takes
    away new placements, not what is booked there (nothing here evicts)."""
    snap = cluster([worker("sim-1", 64, [gpu(0, 24)], cordoned=True), worker("sim-2", 64, [gpu(0, 24)])],
                   [inst("old-0", "old", "sim-1", [0], vram={0: 16 * GiB})])
    assert [i.worker for i in snap.instances] == ["sim-1"]
    d = decide(snap, SPEC, FlatRequest(vram=20 * GiB, ram=GiB))
    assert d.placement.worker == "sim-2"  # 24 - 16 = 8 GiB left on sim-1 would not fit 20 anyway


@pytest.mark.parametrize("column,cordoned", [
    (None, False),  # a store made before cordons: the column was added empty
    (False, False),
    (True, True),
])
def test_the_store_row_feeds_the_snapshot(column, cordoned):
    row = WorkerRow(name="sim-1", ram_total=64 * GiB, gpus=[gpu(0, 24).model_dump(mode="json")], cordoned=column)
    assert worker_model(row).cordoned is cordoned


def test_a_snapshot_without_the_field_still_decodes():
    """Kept decisions and snapshot files written before cordons name no ``cordoned``: not cordoned."""
    w = Worker.model_validate({"name": "sim-1", "ram_total": 64 * GiB})
    assert w.cordoned is False


def test_the_store_records_a_cordon_and_the_ledger_refuses_new_bookings_there(store):
    """records.cordon_worker: None for a host the store has not seen, True when it changed (the
    generation moves, so the snapshot caches read the row), False when it was so already. A plan
    decided before the cordon is refused at booking; a plan already held there stays held."""
    from contracts.control import HostReport, PlacementPlan
    from store import ledger, records
    from store.snapshot import generations, load_snapshot
    from tests.store_fixtures import want

    _, _, engine = store

    def plan(instance_gib: int) -> PlacementPlan:
        return PlacementPlan(worker="sim-1", gpu_indexes=[0], claim={"vram": {0: instance_gib * GiB}, "ram": GiB})

    assert records.cordon_worker(engine, "sim-1", True, "disk swap") is None  # no row yet
    records.upsert_worker(engine, HostReport(name="sim-1", ram_total=64 * GiB, gpus=[gpu(0, 24)], simulated=True))
    want(engine, "old-0", "new-0")
    ledger.reserve(engine, "old-0", plan(16))
    gen = generations(engine)["sim-1"]
    assert records.cordon_worker(engine, "sim-1", True, "disk swap") is True
    assert records.cordon_worker(engine, "sim-1", True, "disk swap") is False  # idempotent
    assert generations(engine)["sim-1"] == gen + 1  # bumped once
    assert [w.cordoned for w in load_snapshot(engine).workers] == [True]
    assert records.workers(engine)[0].cordon_reason == "disk swap"
    with pytest.raises(ledger.StaleDecision, match="host sim-1 is cordoned"):
        ledger.reserve(engine, "new-0", plan(4))  # 16 + 4 of 24 GiB would fit: the cordon refuses it
    assert ledger.reserve(engine, "old-0", plan(16))[1] is False  # the running replica keeps its booking
    assert records.cordon_worker(engine, "sim-1", False) is True
    assert records.workers(engine)[0].cordon_reason == ""
    assert ledger.reserve(engine, "new-0", plan(4))[1] is True


def test_a_store_made_before_cordons_gets_the_columns(sqlite_engine):
    """db.init_db adds the nullable columns to an older store's table; its rows read as not cordoned."""
    from sqlalchemy import text

    from store import db, records

    with sqlite_engine.begin() as c:
        c.execute(text("ALTER TABLE gpuflow_workers DROP COLUMN cordon_reason"))
        c.execute(text("ALTER TABLE gpuflow_workers DROP COLUMN cordoned"))
        c.execute(text("INSERT INTO gpuflow_workers (name, state, cluster, labels, ram_total, unified_memory, "
                       "reserved_ram, reserved_vram, gpus, simulated, fingerprint, generation, state_reason, "
                       "updated_at) VALUES ('old', 'ready', 'default', '{}', 1, 0, 0, 0, '[]', 1, '', 1, '', "
                       "'2025-01-01 00:00:00')"))
    db.init_db(sqlite_engine)
    row = records.workers(sqlite_engine)[0]
    assert (row.cordoned, worker_model(row).cordoned) == (None, False)
