"""deploy's first look (gpuflow/deploy_look.py, issue 37): when it has nothing to say from
visibility alone, and when placing has stalled so that the PENDING replicas are asked why."""

import pytest

from gpuflow.deploy_look import settled, stalled


@pytest.mark.parametrize("seen, wanted, out", [
    ({}, 0, True),                                            # replicas 0: nothing to wait for
    ({"m-0": "running", "m-1": "starting"}, 2, True),         # every wanted replica placed or starting
    ({"m-0": "running"}, 2, False),                           # one not started yet
    ({"m-0": "running", "m-1": "pending"}, 2, False),         # one PENDING: its reason may matter
    ({"m-0": "stopping", "m-1": "running", "m-2": "running"}, 2, True),  # a scale-down's leaver
])
def test_settled(seen, wanted, out):
    assert settled(seen, wanted) is out


@pytest.mark.parametrize("counts, out", [
    ([50], False),              # one look: nothing to compare
    ([50, 50], False),          # two looks, one interval: not yet (STALL_LOOKS 2)
    ([50, 50, 50], True),       # no fall over two intervals: stalled
    ([50, 40, 40], False),      # fell 50 -> 40 within the last two: placing goes on
    ([50, 48, 45, 45, 45], True),  # fell, then stopped: min(45, 45) >= 45
    ([3, 2, 1, 1, 0], False),   # still falling
])
def test_stalled(counts, out):
    assert stalled(counts) is out


NO_ROOM = "unschedulable: The largest allocatable GPU has 70.0 GiB"


@pytest.mark.parametrize("reasons, late, asked, out", [
    # 6 PENDING, none decided yet: the first four asked, the rest not (still deciding, as they are)
    ({}, False, 4, None),
    # the look's time is up and still none decided: nothing to say, and the rest are not asked
    # (they had been: ten deploys of 50 asked 400 replicas at one moment, mid-burst)
    ({}, True, 4, []),
    # one of the first four cannot be placed: the rest are asked too, all 6; four still deciding,
    # so the look goes on (it had ended there, saying nothing)
    ({"m-1": NO_ROOM}, False, 6, None),
    # ... and at the end of the look it is said
    ({"m-1": NO_ROOM}, True, 6, [f"m-1: PENDING: {NO_ROOM}",
                                 "the replica(s) wait in the queue ('gpuflow queue'); 'gpuflow deploy --wait' exits 3 for this"]),
    # every one of them decided, none can be placed: said before the end
    ({f"m-{k}": NO_ROOM for k in range(6)}, False, 6, [f"m-{k}: PENDING: {NO_ROOM}" for k in range(6)]
     + ["the replica(s) wait in the queue ('gpuflow queue'); 'gpuflow deploy --wait' exits 3 for this"]),
])
def test_the_look_asks_the_rest_only_when_one_of_the_first_decided(monkeypatch, reasons, late, asked, out):
    import asyncio

    from contracts.control import InstanceView
    from gpuflow import deploy_look, deploy_wait, ops

    calls = []

    async def instance(client, name, timeout_s=None):  # the replica's status query, answered from the table
        calls.append(name)
        return InstanceView(name=name, deployment="m", model="m", state="pending", reason=reasons.get(name, ""))

    async def no_rollout(client, name):
        return None

    monkeypatch.setattr(ops, "instance", instance)
    monkeypatch.setattr(deploy_wait, "rollout_view", no_rollout)
    seen = {f"m-{k}": "pending" for k in range(6)}
    said = asyncio.run(deploy_look.judged(None, "m", 6, seen, late))
    assert len(calls) == asked
    assert sorted(calls[:4]) == ["m-0", "m-1", "m-2", "m-3"]  # the first four by name
    assert said == out


def looks_a_second(monkeypatch, clock: list[float], states, judged) -> None:
    """The look's visibility read and its judgement answered by ``states`` and ``judged``, on a
    clock (``clock[0]``) that each look's sleep moves on by a second."""
    from gpuflow import deploy_look

    async def sleep(s):
        clock[0] += 1.0

    monkeypatch.setattr(deploy_look, "states", states)
    monkeypatch.setattr(deploy_look, "judged", judged)
    monkeypatch.setattr(deploy_look.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(deploy_look.asyncio, "sleep", sleep)


NOT_YET = [f"m-0: PENDING: {NO_ROOM}", "the replica(s) wait in the queue ('gpuflow queue'); 'gpuflow deploy --wait' exits 3 for this"]


@pytest.mark.parametrize("looks, out, took", [
    # a look a second (the clock below): m-0 refused at first, placed at the third look, in the
    # room a stop-first rollout's step had just made. Said at once, it was a false "exits 3";
    # held for STUCK_S (5 s), nothing is said
    ([NOT_YET, NOT_YET, "placed"], [], 2),
    # refused at every look: said once 5 s of looks said it
    ([NOT_YET] * 8, NOT_YET, 5),
    # a look that did not say it (still deciding) restarts the 5 s
    ([NOT_YET, NOT_YET, None] + [NOT_YET] * 8, NOT_YET, 8),
])
def test_the_look_says_a_replica_stuck_only_once_it_held(monkeypatch, looks, out, took):
    import asyncio

    from gpuflow import deploy_look

    clock, script = [100.0], iter(looks)
    said: list = []

    async def states(client, name):
        said.append(next(script))
        return {"m-0": "running"} if said[-1] == "placed" else {"m-0": "pending"}

    async def judged(client, name, wanted, seen, late):
        return said[-1]

    looks_a_second(monkeypatch, clock, states, judged)
    monkeypatch.setattr(deploy_look, "stalled", lambda counts: True)
    assert asyncio.run(deploy_look.first_look(None, "m", 1, 10.0)) == out
    assert clock[0] - 100.0 == took


@pytest.mark.parametrize("looks, asked", [
    # (replicas there, of them PENDING) at each look, a second apart; 50 wanted. The deployment
    # starts its replicas over the first looks: 0, then 20, then all 50, and placing goes on.
    # Nobody is asked. It had asked the first four at the third and fourth looks, taking their
    # coming for a stall: 0, 20, 50 (min(20, 50) >= 0), then 20, 50, 45 (min(50, 45) >= 20)
    ([(0, 0), (20, 20), (50, 50), (50, 45), (50, 40), (50, 0)], []),
    # ... the same, and placing stops at 45: asked at the second look that shows no fall since
    # all were there (50, 45, 45, 45: min(45, 45) >= 45)
    ([(0, 0), (20, 20), (50, 50), (50, 45), (50, 45), (50, 45), (50, 0)], [6]),
    # all there from the first look: asked at the third look of 50 (no fall over two intervals)
    ([(50, 50), (50, 50), (50, 50), (50, 0)], [3]),
])
def test_the_look_counts_a_stall_once_every_replica_is_there(monkeypatch, looks, asked):
    import asyncio

    from gpuflow import deploy_look

    clock, script, at, n = [100.0], iter(looks), [], [0]

    async def states(client, name):
        n[0] += 1
        there, left = next(script)
        return {f"m-{k}": "pending" if k < left else "running" for k in range(there)}

    async def judged(client, name, wanted, seen, late):
        at.append(n[0])
        return None  # the PENDING still deciding

    looks_a_second(monkeypatch, clock, states, judged)
    assert asyncio.run(deploy_look.first_look(None, "m", 50, 10.0)) == []
    assert at == asked
