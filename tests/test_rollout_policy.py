"""The rollout as a pure step function, driven through whole upgrades: surge first with a spare
GPU, stop-first when the surge cannot be placed, rollback on a crash loop, and the bounds."""

from __future__ import annotations

import pytest

from scheduler.rollout import DONE, ROLLBACK, START, STOP, WAIT, Replica, RolloutConfig, next_step

R = lambda name, ready=True, **kw: Replica(name, "running" if ready else kw.pop("state", "starting"), ready, **kw)  # noqa: E731


def drive(cfg, desired, old, capacity, timeline=60):
    """Run a rollout to the end with ``capacity`` replicas' worth of GPUs (old and new together).
    Each tick: a new replica that has GPUs becomes ready the tick after it started; one without
    GPUs waits (pending since it was created). Returns the steps and the fewest ready replicas seen."""
    old = [R(n) for n in old]
    new: list[Replica] = []
    steps, least, n, now = [], len(old), 0, 0.0
    while now < 3600:
        # started replicas become ready a tick later; pending ones take GPUs as they free up
        free = capacity - len(old) - len([r for r in new if r.pending_since is None])
        ticked = []
        for r in new:
            if r.pending_since is None:
                ticked.append(Replica(r.name, "running", True))
            elif free > 0:
                free -= 1
                ticked.append(Replica(r.name, "scheduled", False))
            else:
                ticked.append(r)
        new = ticked
        step = next_step(cfg, desired, old, new, now)
        steps.append(step)
        if step.action == STOP:
            old = [r for r in old if r.name not in step.names]
        elif step.action == START:
            room = capacity - len(old) - len([r for r in new if r.pending_since is None])
            new.append(Replica(f"v2-{n}", "scheduled" if room > 0 else "pending", False,
                               pending_since=None if room > 0 else now))
            n += 1
        elif step.action == DONE:
            break
        least = min(least, len([r for r in old if r.ready]) + len([r for r in new if r.ready]))
        now += 15
    return steps, least


def test_surge_with_a_spare_gpu_never_dips():
    # 2 replicas, 3 GPUs: start v2-0 (3 in all), v2-0 ready -> stop one old, start v2-1, ... never below 2 ready
    steps, least = drive(RolloutConfig(), 2, ["v1-0", "v1-1"], capacity=3)
    assert [s.action for s in steps if s.action != WAIT] == [START, STOP, START, STOP, DONE]
    assert least >= 2 and not any(s.fallback for s in steps)


def test_no_spare_gpu_falls_back_to_stop_first_after_the_surge_timeout():
    # 2 replicas, 2 GPUs: v2-0 cannot be placed; after 60 s (4 ticks of 15 s) one old replica is stopped
    steps, least = drive(RolloutConfig(surge_timeout_s=60), 2, ["v1-0", "v1-1"], capacity=2)
    fallbacks = [s for s in steps if s.fallback]
    assert len(fallbacks) == 2 and "could not be placed for 60 s" in fallbacks[0].reason
    assert steps[-1].action == DONE
    assert least == 1  # one replica fewer during each fallback step: max_unavailable 1 for that step only


def test_stop_first_when_configured():
    # max_surge 0, max_unavailable 1: stop one, start one
    steps, least = drive(RolloutConfig(max_surge=0, max_unavailable=1), 2, ["v1-0", "v1-1"], capacity=2)
    assert [s.action for s in steps if s.action != WAIT][:2] == [STOP, START]
    assert least == 1 and not any(s.fallback for s in steps)


@pytest.mark.parametrize("new, want", [
    ([Replica("v2-0", "error")], "rolled back: v2-0 is ERROR"),
    ([Replica("v2-0", "starting", restarts=3)], "rolled back: v2-0 restarted 3 times"),
])
def test_a_failing_version_rolls_back(new, want):
    s = next_step(RolloutConfig(), 2, [R("v1-0"), R("v1-1")], new, now=0)
    assert (s.action, s.reason) == (ROLLBACK, want)


def test_two_restarts_are_not_yet_a_failure():
    s = next_step(RolloutConfig(), 2, [R("v1-0"), R("v1-1")], [Replica("v2-0", "starting", restarts=2)], now=0)
    assert s.action == WAIT


def test_an_old_replica_that_serves_nothing_goes_first():
    s = next_step(RolloutConfig(), 2, [R("v1-0"), Replica("v1-1", "error")], [], now=0)
    assert (s.action, s.names) == (STOP, ["v1-1"])


def test_the_fleet_never_exceeds_desired_plus_surge():
    # 2 old ready + 1 new starting = 3 = 2 + surge 1: wait, do not start another
    s = next_step(RolloutConfig(), 2, [R("v1-0"), R("v1-1")], [R("v2-0", ready=False)], now=0)
    assert s.action == WAIT
