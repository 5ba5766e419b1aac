"""A rollout's bake and progress deadline (issue 38): the pure judge (scheduler/rollout_bake.py)
as tables, then the rollout's state driven through workflows/rollout_steps.py ``decide`` with the
replicas' looks a deployment workflow would take: a version that crashes 20 s after its last step is
rolled back by the bake, recorded so, and undo never returns to it; one that bakes clean is good."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from contracts.rollout import ReplicaProbe
from scheduler.rollout import BAKE, DONE, ROLLBACK, START, WAIT, Replica, RolloutConfig, Step
from scheduler.rollout_bake import bake_left, bake_step, progress_key, stalled
from scheduler.spec import ModelSpec
from workflows import rollout_steps as ro

CFG = RolloutConfig(bake_s=60, progress_deadline_s=600)


def up(name: str, restarts: int = 0) -> Replica:
    return Replica(name, "running", ready=True, restarts=restarts)


@pytest.mark.parametrize("desired, since, now, new, base, action, reason", [
    # 10 s into a 60 s bake, both ready, no restart: still baking
    (2, 100, 110, [up("m-2"), up("m-3")], {"m-2": 0, "m-3": 0}, BAKE,
     "baking 60 s: m-2, m-3 must not go ERROR nor restart"),
    # 60 s passed (160 - 100 >= 60), both ready, restarts as at the start (1 = 1): good
    (2, 100, 160, [up("m-2", 1), up("m-3")], {"m-2": 1, "m-3": 0}, DONE,
     "baked 60 s: 2 replica(s) ran without a restart"),
    # m-3 restarted once since the bake saw it (1 - 0 = 1 > 0), 20 s in (120 - 100): rolled back
    (2, 100, 120, [up("m-2"), up("m-3", 1)], {"m-2": 0, "m-3": 0}, ROLLBACK,
     "rolled back: m-3 restarted 1 time(s) 20 s into the bake"),
    # m-2 is ERROR (between its restarts) 21 s in: rolled back, whatever its count
    (2, 100, 121, [Replica("m-2", "error"), up("m-3")], {"m-2": 0, "m-3": 0}, ROLLBACK,
     "rolled back: m-2 is ERROR 21 s into the bake"),
    # the time is up but m-3 is not ready (starting, no restart counted yet): the verdict waits, naming it
    (2, 100, 170, [up("m-2"), Replica("m-3", "starting")], {"m-2": 0, "m-3": 0}, BAKE,
     "baked 60 s; waiting for m-3 to be ready"),
    # the time is up, both ready, but 2 of 3 wanted (scaled up mid-bake, the third not started): waits
    (3, 100, 170, [up("m-2"), up("m-3")], {"m-2": 0, "m-3": 0}, BAKE, "baked 60 s; waiting for 1 more replica(s) to be ready"),
    # a replica the bake has not seen before (no base: scaled up mid-bake) is judged from its own count
    (2, 100, 161, [up("m-2"), up("m-4", 2)], {"m-2": 0}, DONE, "baked 61 s: 2 replica(s) ran without a restart"),
])
def test_the_bake_verdict(desired, since, now, new, base, action, reason):
    s = bake_step(CFG, desired, since, now, new, base)
    assert (s.action, s.reason) == (action, reason)


@pytest.mark.parametrize("deadline, progress_at, now, want", [
    (600, 0, 599, None),  # 599 < 600: still within the deadline
    (600, 0, 600, "rolled back: no progress for 600 s (progress_deadline_s 600): waiting for m-3"),
    (0, 0, 10_000, None),  # 0: no deadline
])
def test_the_progress_deadline(deadline, progress_at, now, want):
    s = stalled(RolloutConfig(progress_deadline_s=deadline), progress_at, now, Step(WAIT, reason="waiting for m-3"))
    assert (s.reason if s else None) == want
    assert s is None or s.action == ROLLBACK


def test_what_counts_as_progress_and_the_time_left():
    a = progress_key([up("m-0")], [Replica("m-1", "pending")])
    assert a == progress_key([up("m-0")], [Replica("m-1", "pending")])  # nothing changed
    assert a != progress_key([up("m-0")], [Replica("m-1", "scheduled")])  # placed: progress
    assert a != progress_key([], [Replica("m-1", "pending")])  # an old one stopped: progress
    assert (bake_left(CFG, 100, 130), bake_left(CFG, 100, 190)) == (30, 0)  # 60 - 30; never below 0


# --- the rollout's state, as the deployment workflow drives it ---------------------------------------

def spec(v: str, bake_s: float = 60, deadline: float = 600) -> dict:
    return ModelSpec.model_validate({"name": "chat", "backend": "custom", "run_command": f"serve {{port}} --name {v}",
                                     "replicas": 1, "source": {"local_path": "/models/chat"},
                                     "resources": {"vram": 2**30, "ram": 2**30},
                                     "rollout": {"bake_s": bake_s, "progress_deadline_s": deadline}}
                                    ).model_dump(mode="json", exclude_none=True)


@pytest.fixture(autouse=True)
def clock(monkeypatch):
    t = [datetime(2025, 1, 1, tzinfo=timezone.utc)]
    monkeypatch.setattr(ro.workflow, "now", lambda: t[0])
    return t


class Roll:
    """The deployment workflow's part: its spec, instances, the rollout state; ``look`` is one pass
    of its rollout loop at time ``t`` over the replicas' probes (name -> (state, restarts))."""

    def __init__(self, raw: dict):
        self.raw, self.instances, self.r = raw, ["chat-0"], ro.state_from(None)
        ro.begin(self.r, raw)

    def deploy(self, raw: dict) -> None:
        ch = ro.change_spec(self.r, self.raw, raw, ModelSpec.model_validate(raw), ModelSpec.model_validate(self.raw))
        self.raw = ch.raw

    def look(self, t: float, probes: dict[str, tuple[str, int]], bake: bool = True) -> Step:
        ps = [ReplicaProbe(name=n, state=s, restarts=k, answers=s == "running") for n, (s, k) in probes.items()]
        step = ro.decide(self.r, self.raw, 1, self.instances, ps, t, bake=bake)
        if step.action == START:
            self.instances.append(f"chat-{len(self.instances)}")
            self.r.versions[self.instances[-1]] = self.r.version
        elif step.action == DONE:
            ro.done(self.r, step.reason, set(self.instances))
        elif step.action == ROLLBACK:
            good = ro.roll_back(self.r, step.reason)
            self.raw = good or self.raw
        elif step.action == "stop_old":
            self.instances = [n for n in self.instances if n not in step.names]
        return step


def roll_to_v1(d: Roll) -> None:
    d.deploy(spec("v1"))
    assert d.look(0, {"chat-0": ("running", 0)}).action == START
    d.look(1, {"chat-0": ("running", 0), "chat-1": ("running", 0)})  # chat-1 answers: seen
    assert d.look(4, {"chat-0": ("running", 0), "chat-1": ("running", 0)}).action == "stop_old"  # 4 - 1 >= SEEN_S


def test_a_version_that_crashes_20_s_after_its_last_step_is_rolled_back_and_never_undone_to():
    d = Roll(spec("v0"))
    roll_to_v1(d)
    assert d.look(5, {"chat-1": ("running", 0)}).action == BAKE  # the last step taken: baking from 5
    assert d.r.rolling and d.r.history[-1].result == "baking"
    assert d.r.status == "baking version 1: 60 s left of 60; a new replica that goes ERROR or restarts rolls it back"
    assert d.look(15, {"chat-1": ("running", 0)}).action == BAKE
    assert d.r.status.startswith("baking version 1: 50 s left")  # 60 - (15 - 5)
    s = d.look(25, {"chat-1": ("running", 1)})  # crashed and restarted 20 s in
    assert (s.action, s.reason) == (ROLLBACK, "rolled back: chat-1 restarted 1 time(s) 20 s into the bake")
    assert [(h.version, h.result, h.reason) for h in d.r.history] == [
        (0, "deployed", ""), (1, "rolled back", "chat-1 restarted 1 time(s) 20 s into the bake")]
    assert d.r.version == 0 and "--name v0" in d.raw["run_command"]  # back to v0, rolled the same way
    to, said = ro.undo_choice(d.r)
    assert to is None or to.version != 1, said  # undo never returns to the failed version


def test_a_version_that_bakes_clean_is_good_and_the_undo_target_after_the_next():
    d = Roll(spec("v0"))
    roll_to_v1(d)
    assert d.look(5, {"chat-1": ("running", 0)}).action == BAKE
    assert d.look(64, {"chat-1": ("running", 0)}).action == BAKE  # 59 s: not yet
    s = d.look(65, {"chat-1": ("running", 0)})
    assert (s.action, s.reason) == (DONE, "baked 60 s: 1 replica(s) ran without a restart")
    assert not d.r.rolling and d.r.status == "version 1 rolled out" and d.r.history[-1].result == "good"


def test_a_new_spec_during_the_bake_replaces_the_baking_version_and_keeps_the_good_one():
    d = Roll(spec("v0"))
    roll_to_v1(d)
    d.look(5, {"chat-1": ("running", 0)})
    d.deploy(spec("v2"))
    assert [(h.version, h.result) for h in d.r.history] == [(0, "deployed"), (1, "replaced"), (2, "rolling")]
    assert d.r.good_version == 0 and d.r.bake_since is None  # a failure of v2 goes back to v0, never to unbaked v1


def test_no_bake_when_asked_for_none_nor_in_histories_before_it():
    for raw, bake in ((spec("v1", bake_s=0), True), (spec("v1"), False)):
        d = Roll(spec("v0"))
        d.deploy(raw)
        d.look(0, {"chat-0": ("running", 0)})
        d.look(1, {"chat-0": ("running", 0), "chat-1": ("running", 0)}, bake)
        d.look(4, {"chat-0": ("running", 0), "chat-1": ("running", 0)}, bake)
        assert d.look(5, {"chat-1": ("running", 0)}, bake).action == DONE and d.r.history[-1].result == "good"


def test_a_rollout_without_progress_for_its_deadline_is_rolled_back_naming_what_it_waited_for():
    d = Roll(spec("v0"))
    d.deploy(spec("v1", deadline=30))
    assert d.look(0, {"chat-0": ("running", 0)}).action == START
    stuck = {"chat-0": ("running", 0), "chat-1": ("starting", 0)}
    assert d.look(2, stuck).action == WAIT  # chat-1 starting: progress at 2
    assert d.look(31, stuck).action == WAIT  # 31 - 2 = 29 < 30
    s = d.look(32, stuck)
    assert (s.action, s.reason) == (ROLLBACK, "rolled back: no progress for 30 s (progress_deadline_s 30): "
                                              "waiting for chat-1")
    assert d.r.history[-1].result == "rolled back"


def test_a_bake_whose_replica_never_gets_ready_is_rolled_back_at_the_deadline():
    # the last step at 5 (chat-1 ready), then chat-1 is seen starting (a hang, no restart counted) from 10:
    # the 60 s bake is up at 65 and waits for it. The deadline (30) counts from the last progress (10), and
    # is judged once the bake's own time is up: at 65, 65 - 10 = 55 >= 30, rolled back
    d = Roll(spec("v0"))
    d.deploy(spec("v1", deadline=30))
    assert d.look(0, {"chat-0": ("running", 0)}).action == START
    d.look(1, {"chat-0": ("running", 0), "chat-1": ("running", 0)})
    assert d.look(4, {"chat-0": ("running", 0), "chat-1": ("running", 0)}).action == "stop_old"
    assert d.look(5, {"chat-1": ("running", 0)}).action == BAKE
    hung = {"chat-1": ("starting", 0)}
    assert d.look(10, hung).action == BAKE  # progress (ready -> starting) at 10
    assert d.look(64, hung).action == BAKE  # 59 s into the bake: still its time
    s = d.look(65, hung)
    assert (s.action, s.reason) == (ROLLBACK, "rolled back: no progress for 55 s (progress_deadline_s 30): "
                                              "baked 60 s; waiting for chat-1 to be ready")
    assert d.r.history[-1].result == "rolled back" and d.r.version == 0


def test_a_bake_past_its_time_says_what_it_waits_for():
    d = Roll(spec("v0"))
    roll_to_v1(d)
    d.look(5, {"chat-1": ("running", 0)})
    assert d.look(70, {"chat-1": ("starting", 0)}).action == BAKE  # progress at 70: the deadline (600) is far
    assert d.r.status == "baking version 1: baked 60 s; waiting for chat-1 to be ready"


def test_the_stand_in_crashes_when_told_to():
    """gpuflow standin --exit-after-s N (the crash the live test rolls back): it answers, then exits 1."""
    import subprocess
    import sys
    import time
    import urllib.request

    from gpuflow.ports import server_port

    port = server_port()
    p = subprocess.Popen([sys.executable, "-m", "gpuflow", "standin", "--port", str(port), "--exit-after-s", "2"],
                         stdout=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        while True:  # it answers /health first
            try:
                assert urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).status == 200
                break
            except OSError:
                assert time.monotonic() - t0 < 20, "the stand-in never answered"
                time.sleep(0.1)
        assert p.wait(20) == 1
        assert "exiting with code 1 after 2 s (--exit-after-s)" in p.stdout.read()
    finally:
        p.kill()


def test_a_replica_seen_error_during_the_bake_is_named_as_the_bake_s_failure():
    d = Roll(spec("v0"))
    roll_to_v1(d)
    d.look(5, {"chat-1": ("running", 0)})
    s = d.look(26, {"chat-1": ("error", 1)})  # caught between its crash and its restart
    assert (s.action, s.reason) == (ROLLBACK, "rolled back: chat-1 is ERROR 21 s into the bake")


# --- the bake's metric checks: the gateways' own counters --------------------------------------------

from scheduler.rollout_bake import metric_check, quantile  # noqa: E402

M = RolloutConfig(bake_max_error_ratio=0.05, bake_max_latency_p90_s=1.0, bake_min_requests=20)
B0 = {"answered": 100, "errors": 1, "buckets": {"0.5": 90, "1.0": 98, "2.5": 100, "+Inf": 100}}


def counts(answered, errors, b05, b1, b25, inf):
    return {"answered": answered, "errors": errors, "buckets": {"0.5": b05, "1.0": b1, "2.5": b25, "+Inf": inf}}


@pytest.mark.parametrize("cfg, cur, fails, said", [
    # 10 answered since the bake began (110 - 100) < 20: not judged
    (M, counts(110, 9, 100, 108, 110, 110), None, "metrics not judged: 10 < 20 requests answered"),
    # 100 answered, 2 of them 5xx (3 - 1): 0.02 <= 0.05; 90 of 100 within 0.5 s (180 - 90): p90 in the 0.5 s bucket
    (M, counts(200, 3, 180, 198, 200, 200), None,
     "100 requests, error ratio 0.020 (<= 0.05), latency p90 <= 0.5 s (<= 1)"),
    # 100 answered, 10 of them 5xx (11 - 1): 0.1 > 0.05
    (M, counts(200, 11, 180, 198, 200, 200), "error ratio 0.100 > 0.05 (10 of 100 answered 5xx)", ""),
    # 100 observed, 50 within 0.5 s, 80 within 1 s, 100 within 2.5 s: p90 in the 2.5 s bucket > 1 s
    (M, counts(200, 1, 140, 178, 200, 200), "latency p90 > 1 s (in the bucket up to 2.5 s) over 100 requests", ""),
    # no threshold set: nothing judged, nothing said
    (RolloutConfig(), counts(200, 100, 100, 100, 100, 200), None, ""),
])
def test_the_metric_checks(cfg, cur, fails, said):
    assert metric_check(cfg, B0, cur) == (fails, said)


def test_the_quantile_of_a_histogram_s_window():
    assert quantile({}, {"0.1": 5, "1": 9, "+Inf": 10}, 0.9) == 1.0  # 9 of 10 within 1 s
    assert quantile({}, {"0.1": 5, "1": 8, "+Inf": 10}, 0.9) == float("inf")
    assert quantile({"0.1": 5, "+Inf": 5}, {"0.1": 5, "+Inf": 5}, 0.9) is None  # nothing since


def test_a_gateway_s_own_metrics_are_read_for_one_model():
    """The real gateway registry (gateway/metrics.py), as its /metrics serves it."""
    from prometheus_client import generate_latest

    from activities.rollout_probe import counts_of
    from gateway.metrics import Metrics

    m = Metrics()
    for code, n in (("200", 7), ("502", 2), ("429", 1)):
        for _ in range(n):
            m.requests.labels("chat", "t", code).inc()
    m.requests.labels("other", "t", "500").inc()
    for s in (0.01, 0.2, 3.0):
        m.duration.labels("chat").observe(s)
    got = counts_of(generate_latest(m.registry).decode(), "chat")
    assert (got.answered, got.errors, got.buckets["+Inf"]) == (10, 2, 3)  # 7 + 2 + 1 answered; the 502s; 3 observed


@pytest.mark.parametrize("text, want", [
    # NaN, infinite and negative counters are 0; a bucket bound that is not a number is left out
    ('gpuflow_gateway_requests_total{model="chat",code="200"} NaN\n'
     'gpuflow_gateway_requests_total{model="chat",code="500"} +Inf\n'
     'gpuflow_gateway_requests_total{model="chat",code="502"} -5\n'
     'gpuflow_gateway_request_duration_seconds_bucket{model="chat",le="abc"} 4\n'
     'gpuflow_gateway_request_duration_seconds_bucket{model="chat",le="NaN"} 4\n'
     'gpuflow_gateway_request_duration_seconds_bucket{model="chat",le="+Inf"} 4\n',
     (0, 0, {"+Inf": 4})),
    # a counter past 1e15 (GatewayCounts' bound) is held at it: 9e15 + 9e15 answered, 9e15 of them 5xx
    ('gpuflow_gateway_requests_total{model="chat",code="200"} 9e15\n'
     'gpuflow_gateway_requests_total{model="chat",code="503"} 9e15\n', (1e15, 1e15, {})),
])
def test_what_a_gateway_serves_is_bounded_before_the_workflow_sees_it(text, want):
    from activities.rollout_probe import counts_of
    from contracts.rollout import GatewayCounts

    got = counts_of(text, "chat")
    assert (got.answered, got.errors, got.buckets) == want
    GatewayCounts.model_validate(got.model_dump())  # as the workflow takes it: valid
    quantile({}, got.buckets, 0.9)  # every bound reads as a number


def test_a_bake_whose_gateways_see_errors_is_rolled_back():
    from contracts.rollout import GatewayCounts

    d = Roll(spec("v0"))
    roll_to_v1(d)
    d.raw["rollout"].update(bake_max_error_ratio=0.05)
    base = GatewayCounts(answered=100, errors=0)
    ps = [ReplicaProbe(name="chat-1", state="running", answers=True)]
    assert ro.decide(d.r, d.raw, 1, d.instances, ps, 5, counts=base).action == BAKE  # the bake's start: counted from here
    s = ro.decide(d.r, d.raw, 1, d.instances, ps, 15, counts=GatewayCounts(answered=150, errors=20))
    assert (s.action, s.reason) == (ROLLBACK, "rolled back: error ratio 0.400 > 0.05 (20 of 50 answered 5xx), "
                                              "10 s into the bake")


def test_rollout_status_shows_the_bake(clock):
    from gpuflow.cli.rollout import render

    d = Roll(spec("v0"))
    roll_to_v1(d)
    d.raw["rollout"].update(bake_max_error_ratio=0.05)
    d.r.history[-1].spec = ModelSpec.model_validate(d.raw)  # the version's spec, as kept, with the threshold
    d.look(5, {"chat-1": ("running", 0)})
    clock[0] = datetime.fromtimestamp(35, tz=timezone.utc)  # the query at 35: 60 - (35 - 5) = 30 s left
    v = ro.view(d.r, "chat", 1, d.instances, set()).model_dump(mode="json")  # as the query answers
    out = render(v).splitlines()
    assert out[0] == ("deployment chat: baking version 1: 60 s left of 60; a new replica that goes ERROR or restarts "
                      "rolls it back")
    assert out[2] == ("  bake: 30 s left; judged: a new replica that goes ERROR or restarts rolls the version back; "
                      "so does a 5xx ratio above 0.05 at the gateways (once 20 requests were answered)"), out


def test_recreate_starts_every_new_replica_at_once_then_bakes():
    from scheduler.rollout import next_step

    cfg = RolloutConfig(strategy="recreate")
    s = next_step(cfg, 3, [], [Replica("m-3", "pending")], 0)  # every old one stopped; 1 of 3 made
    assert (s.action, s.count, s.reason) == (START, 2, "strategy recreate: 2 new replica(s) to start")
    assert next_step(cfg, 3, [], [up("m-3"), up("m-4"), up("m-5")], 0).action == DONE  # then the bake (decide)
    d = Roll(spec("v0"))
    d.deploy({**spec("v1"), "rollout": {"strategy": "recreate", "bake_s": 10}})
    d.instances = []  # the loop stopped every replica
    assert d.look(0, {}).action == START and d.instances == ["chat-0"] and d.r.versions["chat-0"] == 1
    assert d.look(3, {"chat-0": ("running", 0)}).action == WAIT  # answering since 3: seen at 5
    assert d.look(5, {"chat-0": ("running", 0)}).action == BAKE
    assert d.look(15, {"chat-0": ("running", 0)}).action == DONE and d.r.history[-1].result == "good"
