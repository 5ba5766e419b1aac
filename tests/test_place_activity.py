"""The place activity (decide and book in one call, workflows/place_steps.py) on the real store,
run by Temporal's ActivityEnvironment: it books what it decides, returns a decision that does not
place the replica unbooked, and decides again when the ledger refuses its plan because another
control-plane worker booked the same GPU in between. Calls that arrive together are decided on one
refresh and booked in one transaction (activities/place_batch.py)."""

from __future__ import annotations

import dataclasses

import pytest
from temporalio.testing import ActivityEnvironment

from activities.worker_set import control_activities
from activities.place_batch import Placing, place_many
from contracts.control import InstanceRecord
from contracts.placement import PlaceAsk
from store import ledger, records
from scheduler.units import GiB
from tests.test_ledger import host

import asyncio

RAW = {"name": "a", "backend": "custom", "run_command": "x {port}", "source": {"local_path": "/m/a"},
       "resources": {"vram": 20 * GiB, "ram": GiB}}  # 20 GiB: one replica a 24 GiB GPU


def called_by(instance: str) -> ActivityEnvironment:
    """The activity as the instance's own workflow calls it (activities/callers.py)."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, workflow_type="ModelInstanceWorkflow", workflow_id=f"instance/{instance}")
    return env


def seed(engine, gpus: int, names: list[str]) -> None:
    records.upsert_worker(engine, host("h1", gpus=gpus, gib=24))
    records.save_deployment(engine, "a", RAW, len(names))
    for n in names:
        records.create_instance(engine, InstanceRecord(name=n, deployment="a", model="a", state="pending"))


async def test_place_books_what_it_decides_and_returns_the_rest_unbooked(store):
    _, _, engine = store
    seed(engine, 1, ["a-0", "a-1"])
    acts = control_activities(engine, None)
    try:
        got = await called_by("a-0").run(acts.placement.place_replica, PlaceAsk(instance="a-0", spec=RAW))
        assert got.booked is not None and got.booked.plan.gpu_indexes == [0] and got.decision.scheduled
        assert ledger.booked_per_gpu(engine) == {("h1", 0): 20 * GiB}
        row = {r.name: r for r in records.instances_of(engine)}["a-0"]
        assert row.state == "scheduled" and row.reason == f"{got.decision.strategy}: score {got.decision.score}"  # in the booking's transaction
        assert row.decision["placement"]["gpu_indexes"] == [0] and row.queued_at is None
        got = await called_by("a-1").run(acts.placement.place_replica, PlaceAsk(instance="a-1", spec=RAW))
        assert got.booked is None and not got.decision.scheduled  # 20 + 20 > 24: it waits
    finally:
        acts.runner.shutdown()


async def test_a_plan_refused_by_the_ledger_is_decided_again_in_the_same_call(store, monkeypatch):
    """Two GPUs. This worker decides GPU 0 for a-0; before it books, the other control-plane
    worker books a-1 there (its cache did not know). The ledger refuses a-0's plan; the same call
    decides again and books GPU 1."""
    _, _, engine = store
    seed(engine, 2, ["a-0", "a-1"])
    acts, other = control_activities(engine, None), control_activities(engine, None)
    real = ledger.reserve_many
    calls: list[str] = []

    def reserve_many(engine_, bookings):
        calls.extend(f"{b.instance}@{b.plan.gpu_indexes}" for b in bookings)
        if len(calls) == 1:
            theirs = other.decider.decide("a-1", acts_spec(), other.estimates.get(acts_spec()))
            assert theirs.plan.gpu_indexes == bookings[0].plan.gpu_indexes  # it picked the same GPU
            real(engine_, [ledger.Booking("a-1", theirs.plan)])
        return real(engine_, bookings)

    monkeypatch.setattr(ledger, "reserve_many", reserve_many)
    try:
        got = await called_by("a-0").run(acts.placement.place_replica, PlaceAsk(instance="a-0", spec=RAW))
        assert got.booked is not None
        assert calls == ["a-0@[0]", "a-0@[1]"]  # refused on GPU 0, booked on GPU 1
        assert ledger.booked_per_gpu(engine) == {("h1", 0): 20 * GiB, ("h1", 1): 20 * GiB}
        assert ledger.overbooked(engine) == []
    finally:
        acts.runner.shutdown()
        other.runner.shutdown()


def acts_spec():
    from scheduler.spec import ModelSpec

    return ModelSpec.model_validate(RAW)


async def test_a_replica_launched_at_once_is_booked_starting_and_a_bad_state_is_refused(store):
    """The workflow launches in the task that places it, so the booking writes the
    row STARTING with no reason (what the workflow's own STARTING record wrote), the decision kept.
    Any other state than SCHEDULED or STARTING is refused before anything is booked."""
    from temporalio.exceptions import ApplicationError

    _, _, engine = store
    seed(engine, 2, ["a-0", "a-1"])
    acts = control_activities(engine, None)
    try:
        got = await called_by("a-0").run(acts.placement.place_replica, PlaceAsk(instance="a-0", spec=RAW, then="starting"))
        row = {r.name: r for r in records.instances_of(engine)}["a-0"]
        assert (row.state, row.reason, row.worker, row.queued_at) == ("starting", "", "h1", None)
        assert row.decision["placement"]["gpu_indexes"] == got.booked.plan.gpu_indexes
        with pytest.raises(ApplicationError, match="not 'running'"):
            await called_by("a-1").run(acts.placement.place_replica, PlaceAsk(instance="a-1", spec=RAW, then="running"))
        assert ledger.booked_per_gpu(engine) == {("h1", got.booked.plan.gpu_indexes[0]): 20 * GiB}  # a-1 booked nothing
    finally:
        acts.runner.shutdown()


@pytest.mark.parametrize("gpus, asked, booked_on", [
    # three 24 GiB GPUs, four replicas of 20 GiB asking together: each decision sees the GPUs
    # handed out before it (spread: an empty GPU first); the fourth finds 4 GiB free on each and waits
    (3, 4, [[0], [1], [2], None]),
    (2, 2, [[0], [1]]),
])
def test_a_batch_is_decided_in_turn_and_booked_in_one_transaction(store, monkeypatch, gpus, asked, booked_on):
    """place_many, the work of one batch: every decision sees the batch's earlier placements (not
    only assumed: booked with it), and one reserve_many books what was placed."""
    _, _, engine = store
    names = [f"a-{i}" for i in range(asked)]
    seed(engine, gpus, names)
    acts = control_activities(engine, None)
    real, batches = ledger.reserve_many, []

    def reserve_many(engine_, bookings):
        batches.append([b.instance for b in bookings])
        return real(engine_, bookings)

    monkeypatch.setattr(ledger, "reserve_many", reserve_many)
    try:
        spec = acts_spec()
        got = place_many(acts.decider, engine, [Placing(n, spec, acts.estimates.get(spec), "scheduled") for n in names])
        assert [g.booked.plan.gpu_indexes if g.booked else None for g in got] == booked_on
        assert batches == [[n for n, b in zip(names, booked_on) if b]]  # the waiting one is not offered to the ledger
        assert ledger.overbooked(engine) == []
    finally:
        acts.runner.shutdown()


async def test_replicas_asking_at_once_are_placed_without_conflicts(store, monkeypatch):
    """Six calls of the activity at once on three GPUs of 24 GiB: three booked on three GPUs, three
    waiting, whatever batches they fell into; no plan offered to the ledger is refused."""
    _, _, engine = store
    names = [f"a-{i}" for i in range(6)]
    seed(engine, 3, names)
    acts = control_activities(engine, None)
    real, offered = ledger.reserve_many, []

    def reserve_many(engine_, bookings):
        offered.extend(b.instance for b in bookings)
        return real(engine_, bookings)

    monkeypatch.setattr(ledger, "reserve_many", reserve_many)
    try:
        got = await asyncio.gather(*(called_by(n).run(acts.placement.place_replica, PlaceAsk(instance=n, spec=RAW)) for n in names))
        placed = sorted(g.booked.plan.gpu_indexes[0] for g in got if g.booked)
        assert placed == [0, 1, 2] and len(offered) == 3
        assert acts.metrics.conflicts.labels("rejected")._value.get() == 0
        assert ledger.overbooked(engine) == []
    finally:
        acts.runner.shutdown()


async def test_only_the_instances_own_workflow_books_or_releases_it(store):
    """Somebody's workflow scheduling the place or release activity for a replica (here: a test's
    default caller, and a-1's workflow acting for a-0) is refused, naming both; nothing moves.
    Release had let anybody free a running replica's GPUs for a second booking."""
    from temporalio.exceptions import ApplicationError

    from contracts.control import InstanceRef

    _, _, engine = store
    seed(engine, 1, ["a-0", "a-1"])
    acts = control_activities(engine, None)
    try:
        for env in (ActivityEnvironment(), called_by("a-1")):
            with pytest.raises(ApplicationError, match=r"place_replica acts only for the workflow its input names "
                                                       r"\(ModelInstanceWorkflow 'instance/a-0'\); called by ") as e:
                await env.run(acts.placement.place_replica, PlaceAsk(instance="a-0", spec=RAW))
            assert e.value.type == "InvalidInput" and e.value.non_retryable
        assert ledger.booked_per_gpu(engine) == {}
        await called_by("a-0").run(acts.placement.place_replica, PlaceAsk(instance="a-0", spec=RAW))
        with pytest.raises(ApplicationError, match="'instance/a-0'.*called by ModelInstanceWorkflow 'instance/a-1'"):
            await called_by("a-1").run(acts.placement.release_placement, InstanceRef(instance="a-0"))
        assert ledger.booked_per_gpu(engine) == {("h1", 0): 20 * GiB}  # a-0 still holds its GPU
    finally:
        acts.runner.shutdown()
