"""A host's agent runs as the store tells them apart (records.see_worker): a hello from a new agent
run (HostReport.boot) is a restart, which the control plane tells the instances placed there
(activities/host_news.py); an inventory change alone is not. And ledger.instances_on: whom to tell.
On a real SQLite file and a real PostgreSQL schema."""

from __future__ import annotations

from activities.payloads import HostReport, PlacementPlan
from activities.store import ledger, records
from scheduler.cluster import GPU
from scheduler.units import GiB


def report(boot: str, gpus: int = 1) -> HostReport:
    return HostReport(name="h1", ram_total=64 * GiB, gpus=[GPU(index=i, vram_total=24 * GiB) for i in range(gpus)],
                      simulated=True, boot=boot)


# each row follows the last on the same store: (what happens, the report, (changed, restarted))
RUNS = [
    ("the first hello: new to the store", report("run-a"), (True, False)),
    ("the same run reports again", report("run-a"), (False, False)),
    ("its inventory changed (the watch's report)", report("run-a", gpus=2), (True, False)),
    ("a new run says hello with the same inventory", report("run-b", gpus=2), (False, True)),
    ("an agent from before boot ids (none): not a restart", report("", gpus=2), (False, False)),
    ("the run after it: the last known run was run-b", report("run-c", gpus=2), (False, True)),
    ("a new run on a changed host: both", report("run-d", gpus=1), (True, True)),
]


def test_a_new_agent_run_is_a_restart_and_an_inventory_change_is_not(store):
    _, _, engine = store
    seen = [(what, records.see_worker(engine, r)) for what, r, _ in RUNS]
    assert seen == [(what, want) for what, _, want in RUNS]
    assert records.workers(engine)[0].state == "ready"


def test_the_instances_on_a_host_are_those_with_ledger_lines_there(store):
    _, _, engine = store
    for h in ("h1", "h2"):
        records.upsert_worker(engine, report("x").model_copy(update={"name": h, "gpus": [GPU(index=i, vram_total=24 * GiB)
                                                                                          for i in range(2)]}))
    one = {"vram": {0: GiB}, "ram": GiB}
    ledger.reserve(engine, "a-0", PlacementPlan(worker="h1", gpu_indexes=[0], claim=one))
    ledger.reserve(engine, "b-0", PlacementPlan(worker="h2", gpu_indexes=[0], claim=one))
    # c-0 spans both: main on h2, a subordinate on h1 (it must hear of h1 too)
    ledger.reserve(engine, "c-0", PlacementPlan(worker="h2", gpu_indexes=[1], claim=one,
                                                subordinates=[{"worker": "h1", "gpu_indexes": [1],
                                                               "claim": {"vram": {1: GiB}, "ram": GiB}}]))
    assert ledger.instances_on(engine, "h1") == ["a-0", "c-0"]
    assert ledger.instances_on(engine, "h2") == ["b-0", "c-0"]
    ledger.release(engine, "c-0")
    assert ledger.instances_on(engine, "h1") == ["a-0"]
    assert ledger.instances_on(engine, "h9") == []
