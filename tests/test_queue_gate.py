"""The queue's order kept at the decision (activities/queue_gate.py), on SQLite and PostgreSQL: a
replica woken to decide again is not placed on capacity that the queue gives to a replica ahead of
it, whoever woke it; a replica deciding for the first time, or one the freed capacity holds
beside those ahead of it, is placed as the policy says."""

from __future__ import annotations

import pytest

from activities.decider import Decider
from activities.estimate_cache import EstimateCache
from activities.metrics import ControlMetrics
from activities.queue_gate import QueueGate
from activities.wake_queue import known_request
from contracts.control import InstanceRecord
from store import db, records, tenants
from store.decision_replay import replay
from store.snapshot_cache import SnapshotCache
from scheduler.policy_config import PolicyConfig
from scheduler.spec import ModelSpec
from scheduler.tenancy.config import TenantsFile
from scheduler.units import GiB
from tests.test_ledger import host

TENANTS = {"tenants": [{"name": "prod", "priority": 100}, {"name": "poc", "priority": 10}]}


def raw(name: str, tenant: str = "poc", priority: int = 0) -> dict:
    return {"name": name, "backend": "custom", "run_command": "serve {port}", "source": {"local_path": f"/m/{name}"},
            "resources": {"vram": 20 * GiB, "ram": 0}, "priority": priority, "tenant": tenant}


DEPLOYMENTS = {"hi": raw("hi", "prod"), "lo": raw("lo"), "lo2": raw("lo2", priority=5), "a": raw("a")}


@pytest.mark.parametrize("gpus, waiting, decided, deciding, held_by", [
    # one GPU of 24 GiB holds one replica of 20 GiB; ``waiting``: the PENDING replicas in the order they
    # arrived; ``decided``: those that recorded a decision (woken to decide again: gated)
    (1, ["hi-0", "lo-0"], ["hi-0", "lo-0"], "lo-0", "hi-0"),   # prod (100) before poc (10): lo waits
    (1, ["hi-0", "lo-0"], ["hi-0", "lo-0"], "hi-0", None),     # the head itself is placed
    (1, ["hi-0", "lo-0"], ["lo-0"], "lo-0", "hi-0"),           # hi just started: it decides by itself, and is ahead
    (1, ["hi-0", "lo-0"], ["hi-0"], "lo-0", None),             # lo's first decision is not gated
    (2, ["hi-0", "lo-0"], ["hi-0", "lo-0"], "lo-0", None),     # 2 GPUs: both fit, both are woken: lo placed
    (1, ["lo2-0", "lo-0"], ["lo2-0", "lo-0"], "lo-0", "lo2-0"),  # one tenant: deployment priority 5 before 0
    (1, ["a-0", "a-1"], ["a-0", "a-1"], "a-1", "a-0"),         # one deployment: arrival, a-0 first
    (1, ["lo-0"], ["lo-0"], "lo-0", None),                     # alone in the queue
])
def test_a_woken_replica_waits_behind_the_replicas_ahead_of_it(store, gpus, waiting, decided, deciding, held_by):
    _, _, engine = store
    tenants.apply(engine, TenantsFile.model_validate(TENANTS))
    records.upsert_worker(engine, host("h1", gpus=gpus, gib=24))
    for d in sorted({n.rsplit("-", 1)[0] for n in waiting}):
        records.save_deployment(engine, d, DEPLOYMENTS[d], 2)
    for n in waiting:
        records.create_instance(engine, InstanceRecord(name=n, deployment=n.rsplit("-", 1)[0], model=n.rsplit("-", 1)[0],
                                                       state="pending"))
    for n in decided:
        records.record_instance(engine, InstanceRecord(name=n, deployment=n.rsplit("-", 1)[0], model=n.rsplit("-", 1)[0],
                                                       state="pending", decision={"scheduled": False}))
    cache = EstimateCache()
    decider = Decider(engine, db.reader(engine), SnapshotCache(), PolicyConfig(), ControlMetrics())
    decider.gate = QueueGate(db.reader(engine), lambda s: known_request(cache, s))
    spec = ModelSpec.model_validate(DEPLOYMENTS[deciding.rsplit("-", 1)[0]])
    rec = decider.decide(deciding, spec, cache.get(spec))
    if held_by is None:
        assert rec.places_outright and not rec.held, rec.reasons
        assert decider.snapshots.assumed() == [deciding]
        return
    assert not rec.scheduled and rec.plan is None and rec.inputs is None
    assert rec.held == rec.reasons[0] == f"held back while {held_by} (ahead of it in the queue) takes the capacity freed now"
    assert rec.decisive == 1 and rec.candidates  # the policy's candidates stay, for explain
    assert decider.snapshots.assumed() == []  # nothing promised: the capacity stays for the one ahead


def test_without_the_gate_the_woken_replica_takes_the_gpu(store):
    """The same first row without a gate: the policy alone places lo-0 (what the gate prevents)."""
    _, _, engine = store
    tenants.apply(engine, TenantsFile.model_validate(TENANTS))
    records.upsert_worker(engine, host("h1", gpus=1, gib=24))
    for d in ("hi", "lo"):
        records.save_deployment(engine, d, DEPLOYMENTS[d], 1)
        records.record_instance(engine, InstanceRecord(name=f"{d}-0", deployment=d, model=d, state="pending",
                                                       decision={"scheduled": False}))
    decider = Decider(engine, db.reader(engine), SnapshotCache(), PolicyConfig(), ControlMetrics())
    spec = ModelSpec.model_validate(DEPLOYMENTS["lo"])
    assert decider.decide("lo-0", spec, EstimateCache().get(spec)).places_outright


def test_a_held_record_replays_the_newest_kept_decision(sqlite_engine):
    """explain --replay on a replica whose last record the queue held: that record is no decision of
    the policy's (it keeps no inputs); the newest kept one is replayed, against its own record."""
    from activities.decision_keeper import DecisionKeeper

    engine = sqlite_engine
    tenants.apply(engine, TenantsFile.model_validate(TENANTS))
    records.upsert_worker(engine, host("h1", gpus=1, gib=24))
    for d in ("hi", "lo"):
        records.save_deployment(engine, d, DEPLOYMENTS[d], 1)
        records.create_instance(engine, InstanceRecord(name=f"{d}-0", deployment=d, model=d, state="pending"))
    cache = EstimateCache()
    keeper = DecisionKeeper(engine, every_s=0.01)
    decider = Decider(engine, db.reader(engine), SnapshotCache(), PolicyConfig(), ControlMetrics(), keeper)
    decider.gate = QueueGate(db.reader(engine), lambda s: known_request(cache, s))
    spec = ModelSpec.model_validate(DEPLOYMENTS["lo"])
    first = decider.decide("lo-0", spec, cache.get(spec))  # its first decision: placed, kept
    decider.snapshots.forget("lo-0")  # never booked
    records.record_instance(engine, InstanceRecord(name="lo-0", deployment="lo", model="lo", state="pending",
                                                   decision={"scheduled": False}))
    records.record_instance(engine, InstanceRecord(name="hi-0", deployment="hi", model="hi", state="pending",
                                                   decision={"scheduled": False}))
    again = decider.decide("lo-0", spec, cache.get(spec))
    assert first.places_outright and first.inputs and again.held and again.inputs is None
    keeper.flush()
    got = replay(engine, "lo-0", again)
    assert got["inputs"] == first.inputs and got["same"], got
