"""A host's agent runs as the store tells them apart (records.see_worker): a hello from a new agent
run (HostReport.boot) is a restart, which the control plane tells the instances placed there
(activities/host_news.py); an inventory change alone is not. And ledger.instances_on: whom to tell,
of a restart and of a process's end (host_news.ends).
On a real SQLite file and a real PostgreSQL schema."""

from __future__ import annotations

import pytest

from activities import host_news
from contracts.control import HostReport, PlacementPlan
from contracts.process_end import ProcessEnd
from store import ledger, records
from scheduler.cluster import GPU
from scheduler.units import GiB
from tests.store_fixtures import want


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
    want(engine, "a-0", "b-0", "c-0")
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


@pytest.mark.parametrize("ended, told", [
    # a-0 and c-0 hold ledger lines on h1 (c-0 a helper there); b-0 is placed on h2 only
    ([("a-0", 11)], [("a-0", "a-0", 11)]),
    ([("b-0", 12)], []),  # h1's report does not speak for a process placed on h2
    ([("c-0@rpc0", 13), ("b-0", 12), ("a-0", 11)], [("c-0", "c-0@rpc0", 13), ("a-0", "a-0", 11)]),  # in its order
    ([("z-0", 14)], []),  # nobody's
])
def test_a_hosts_report_of_ended_processes_is_told_only_to_instances_placed_there(ended, told):
    got = host_news.ends("h1", [ProcessEnd(key=k, pid=pid, returncode=1, reason="x" * 900) for k, pid in ended],
                         {"a-0", "c-0"})
    assert [(n, x.key, x.pid) for n, x in got] == told
    assert all(x.host == "h1" and x.kind == "exited" and x.returncode == 1 and len(x.why) == 500 for _, x in got)


def test_a_host_is_forgotten_only_when_it_holds_nothing_and_does_not_answer(store):
    """records.forget_worker, step by step on one store: (what happens, the step, the refusal or None)."""
    import pytest
    from sqlmodel import Session, select

    from store.tables import ModelFileRow

    _, _, engine = store
    records.upsert_worker(engine, report("x"))
    one = {"vram": {0: GiB}, "ram": GiB}
    want(engine, "a-0", "b-0")
    ledger.reserve(engine, "a-0", PlacementPlan(worker="h1", gpu_indexes=[0], claim=one))
    with Session(engine) as s:
        s.add(ModelFileRow(worker="h1", source="hf:o/m", state="ready"))
        s.commit()
    steps = [
        ("READY: its agent answers", lambda: None, "host h1 is READY; stop its agent first"),
        ("lost, but a-0 still holds GPU 0", lambda: records.set_worker_state(engine, "h1", "not_ready", "lost"),
         "host h1 still holds the reservations of 1 replica(s) (a-0)"),
        ("a-0 moved away: forgotten", lambda: ledger.release(engine, "a-0"), None),
        ("again: nothing left to remove", lambda: None, None),
    ]
    for what, step, refused in steps:
        step()
        got = records.forget_worker(engine, "h1")
        assert (got is None) if refused is None else (got or "").startswith(refused), (what, got)
    assert records.workers(engine) == []
    with Session(engine) as s:
        assert s.exec(select(ModelFileRow)).all() == []  # its sightings went with it
    with pytest.raises(ledger.StaleDecision, match="worker h1 is not in the store"):  # nothing books on it now
        ledger.reserve(engine, "b-0", PlacementPlan(worker="h1", gpu_indexes=[0], claim=one))
