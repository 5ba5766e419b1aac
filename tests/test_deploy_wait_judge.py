"""``deploy --wait``'s judge (gpuflow/deploy_wait.py) over every rollout strategy (issue 38): 0 only
once the rollout has finished and baked, 3 only when a replica cannot be placed and no rollout step
can make room for it, 1 for a failure, a rollback or a replaced version. Each row is what
``gpuflow status`` and the ``rollout`` query show at one moment of that strategy's rollout; ``version``
is the version the deploy made. The live exit codes: tests/test_rollout_bake_live.py."""

from __future__ import annotations

import pytest

from gpuflow.deploy_wait import judge
from scheduler.reasons import pending_text

NOFIT = pending_text(["No workers meet the resource requirements.", "The largest GPU has 24.0 GiB."], 1)
STUCK = f"m-2: PENDING: {NOFIT}"


def dep(*states, replicas: int = 2, reason: str = NOFIT) -> dict:
    return {"name": "m", "replicas": replicas,
            "instances": [{"name": f"m-{k}", "state": s, "reason": reason if s == "pending" else ""}
                          for k, s in states]}


def view(result: str = "good", version: int = 1, rolling: bool = False, old=(), stopping=(), baking: bool = False,
         reason: str = "", status: str = "") -> dict:
    return {"rolling": rolling, "old": list(old), "stopping": list(stopping), "baking": baking, "bake_left_s": 42.0,
            "version": version, "status": status or f"version {version} {result}",
            "history": [{"version": 0, "result": "deployed", "reason": ""},
                        {"version": version, "result": result, "reason": reason}]}


@pytest.mark.parametrize("strategy, d, v, code, first", [
    # --- surge-first (rolling): a new replica beside the old ones
    ("surge", dep((0, "running"), (1, "running"), (2, "starting")), view("rolling", rolling=True, old=["m-0", "m-1"]),
     None, "deployment m: RUNNING 2, STARTING 1 of 2 wanted (rolling)"),
    # every replica new and RUNNING, the last step taken: baking, not done
    ("surge", dep((2, "running"), (3, "running")), view("baking", rolling=True, baking=True),
     None, "deployment m: RUNNING 2 of 2 wanted (baking: 42 s left)"),
    # the bake passed: good, nothing rolling, nothing old: 0
    ("surge", dep((2, "running"), (3, "running")), view("good"), 0, "deployment m: 2 of 2 replica(s) RUNNING"),
    # --- stop-first: the surge replica cannot be placed, but an old one will be stopped for it: wait, never 3
    ("stop-first", dep((0, "running"), (1, "running"), (2, "pending")), view("rolling", rolling=True, old=["m-0", "m-1"]),
     None, "deployment m: RUNNING 2, PENDING 1 of 2 wanted (rolling)"),
    # the old one it stopped is still stopping (its GPU not free yet): wait
    ("stop-first", dep((1, "running"), (2, "pending")), view("rolling", rolling=True, old=["m-1"], stopping=["m-0"]),
     None, "deployment m: PENDING 1, RUNNING 1 of 2 wanted (rolling)"),
    # no old replica left, none stopping, and the new one fits nowhere: no step can make room: 3
    ("stop-first", dep((3, "running"), (2, "pending")), view("rolling", rolling=True), 3, STUCK),
    # --- recreate: every old replica stopping, the new ones wait for their GPUs: wait
    ("recreate", dep((2, "pending"), (3, "pending"), replicas=2),
     view("rolling", rolling=True, stopping=["m-0", "m-1"]), None, "deployment m: PENDING 2 of 2 wanted (rolling)"),
    # all started at once and RUNNING: it bakes before it is done
    ("recreate", dep((2, "running"), (3, "running")), view("baking", rolling=True, baking=True), None,
     "deployment m: RUNNING 2 of 2 wanted (baking: 42 s left)"),
    ("recreate", dep((2, "running"), (3, "running")), view("good"), 0, "deployment m: 2 of 2 replica(s) RUNNING"),
    # --- no rollout (a new deployment, a scale): pending with nothing to stop: 3
    ("none", dep((0, "running"), (2, "pending")), view("deployed", version=0), 3, STUCK),
    # --- failures: 1
    # the bake caught a crash: the version is rolled back (v0's replicas serve again): 1, named
    ("surge", dep((0, "running"), (1, "running")),
     view("rolled back", reason="m-2 restarted 1 time(s) 20 s into the bake", status="rolled back: m-2 ..."),
     1, "deployment m: version 1 was rolled back: m-2 restarted 1 time(s) 20 s into the bake"),
    # the rollback under way still counts: the version this deploy made failed
    ("stop-first", dep((0, "running"), (2, "running")),
     view("rolled back", rolling=True, old=["m-2"], reason="no progress for 600 s (progress_deadline_s 600): waiting"),
     1, "deployment m: version 1 was rolled back: no progress for 600 s (progress_deadline_s 600): waiting"),
    # a newer deploy replaced this one's version before it finished
    ("surge", dep((2, "running"), (3, "running")), view("replaced", reason="version 2 came before its rollout finished"),
     1, "deployment m: version 1 was replaced: version 2 came before its rollout finished"),
    # a replica ERROR: 1 at once, even while another waits for room
    ("surge", dep((0, "running"), (2, "error")), view("rolling", rolling=True, old=["m-0"]), 1, "m-2: ERROR: no reason recorded"),
    # --- a prefill/decode group rolled whole: the new generation forming beside the old one waits
    ("whole", dep((0, "running"), (1, "running"), (2, "pending"), replicas=2),
     view("rolling", rolling=True, old=["m-0", "m-1"]), None, "deployment m: RUNNING 2, PENDING 1 of 2 wanted (rolling)"),
])
def test_the_wait_verdict_for_every_strategy(strategy, d, v, code, first):
    got = judge(d, v, version=1 if strategy != "none" else 0)
    assert (got.code, got.lines[0]) == (code, first), strategy


def test_an_older_rollback_does_not_fail_a_deploy_that_changed_nothing():
    # version 1 was rolled back long ago (status still says so); this deploy's version is 0, good
    v = {**view("rolled back", status="rolled back: m-2 is ERROR"), "version": 0}
    assert judge(dep((0, "running"), (1, "running")), v, version=0).code == 0
    # without a version (an older CLI's view), the status still says it
    assert judge(dep((0, "running"), (1, "running")), v).lines[0] == "deployment m: its rollout was rolled back: m-2 is ERROR"


STILL = "deployment m: PENDING 1 of 1 wanted"  # the progress line a look shows until 3 stands


@pytest.mark.parametrize("code, since, now, out_code, out_since", [
    # the first look that says 3: it starts the clock, and the progress line is shown
    (3, None, 100.0, None, 100.0),
    # 4.9 s of looks that all said 3: not yet (STUCK_S 5; in CI's failed run a replica refused
    # while the old one it waited for still ran was placed 6.7 s later, its room made meanwhile)
    (3, 100.0, 104.9, None, 100.0),
    # 5.0 s: it stands
    (3, 100.0, 105.0, 3, 100.0),
    # a look that says anything else (the replica was placed in the room a step made): the clock stops
    (None, 100.0, 101.0, None, None),
    # ... and a failure is said at once, held or not
    (1, 100.0, 101.0, 1, None),
    (0, None, 101.0, 0, None),
])
def test_a_stuck_verdict_stands_once_every_look_for_5_s_said_it(code, since, now, out_code, out_since):
    from gpuflow.deploy_wait import Verdict, held

    v, s = held(Verdict(code, ["said"]), since, now, STILL)
    assert (v.code, s) == (out_code, out_since)
    assert v.lines == ([STILL] if out_code is None and code == 3 else ["said"])


@pytest.mark.parametrize("since, now, deadline, out", [
    # the look (no --wait) began saying a replica no host can take at 3 s, its time up at 10 s:
    # at 7.9 s it has said so for 4.9 s, not yet (STUCK_S 5, as --wait's exit 3)
    (3.0, 7.9, 10.0, False),
    # 8.0 s: 5 s of looks said it: it is said
    (3.0, 8.0, 10.0, True),
    # began at 9.5 s, just before the time was up: the look goes on past it, to 14.5 s ...
    (9.5, 14.4, 10.0, False),
    (9.5, 14.5, 10.0, True),
    # ... and never past the end plus STUCK_S (a look that kept restarting its clock)
    (14.9, 15.1, 10.0, True),
])
def test_a_look_without_wait_says_stuck_once_it_held_for_5_s(since, now, deadline, out):
    from gpuflow.deploy_wait import said_long

    assert said_long(since, now, deadline) is out
