"""The autoscaler that jumps (issue 38) as tables: the ``concurrency`` rule's desired count
(KPA's ceil(observed / target)), the step rates that bound a jump, scale-in only after a stable
window, the capacity block that holds across re-checks, and steps kept before the rates that still
replay as they decided. Times are seconds on the caller's clock; samples every 15 s unless a row says."""

from __future__ import annotations

import json

import pytest

from scheduler.autoscale import kept
from scheduler.autoscale.codec import sample_in, sample_out, state_in
from scheduler.autoscale.config import Autoscaling
from scheduler.autoscale.kpa import needed
from scheduler.autoscale.policy import DOWN, HOLD, UP, PolicyState, decide, down_bound, unstepped, up_bound
from scheduler.autoscale.signals import Sample, Window, combine


def s(at, conc, running=1, requests=None, complete=True):
    """A sample with ``conc`` requests in the system at its end (all in flight: none finished),
    or, with ``requests``, that many requests seen in the window."""
    n = conc if requests is None else requests
    return Sample(at=at, running_replicas=running, complete=complete, requests=float(n), finished=0.0,
                  concurrency=float(conc))


def cfg(**kw):
    base = {"min_replicas": 1, "max_replicas": 20, "stable_window_s": 15, "panic_window_s": 15,
            "scale_down_stabilization_s": 0, "rules": [{"kind": "concurrency", "target": 4, "min_samples": 5}]}
    return Autoscaling.model_validate({**base, **kw})


# --- the desired count: ceil(observed / target), never 0 while there is traffic
@pytest.mark.parametrize("observed, target, want", [
    (16, 4, 4),          # 16 / 4 = 4.0 -> 4
    (16.5, 4, 5),        # 4.125 -> 5
    (12.000000001, 4, 3),  # float noise is not a fifth... a fourth replica
    (0.5, 4, 1),         # 0.125 -> 1
    (0, 4, 0),           # nothing in the system: 0
    (24, 8, 3),          # 24 callers at 8 a replica: 3
])
def test_needed_is_ceil_of_observed_over_target(observed, target, want):
    assert needed(observed, target) == want


# --- one step to the computed count: the ramp from 1 replica to the load of 4
@pytest.mark.parametrize("conc, running, current, want, why", [
    (16, 1, 1, 4, "16 / 4 = 4 >= 2 x 1 running: a burst, 1 -> 4 in one step"),
    (40, 1, 1, 10, "40 / 4 = 10: 1 -> 10 (max_scale_up_rate 1000 allows 1000)"),
    (6, 1, 1, 2, "6 / 4 = 2 (ceil 1.5) >= 2 x 1: 1 -> 2"),
    (16, 1, 4, 4, "3 starting already make 4 = the desired count: hold"),
    (20, 4, 4, 5, "20 / 4 = 5 > 4 running, not a burst (5 < 2 x 4): the stable window's 5"),
    (16, 4, 4, 4, "16 / 4 = 4 running: hold"),
])
def test_a_ramp_gets_its_count_in_one_step(conc, running, current, want, why):
    hist = [s(0, conc, running), s(15, conc, running)]
    d, _ = decide(cfg(), hist, current=current, starting=current - running, now=15)
    assert d.desired == want, (why, d.reason)


def test_the_next_step_after_the_jump_holds_on_fresh_samples():
    # 1 -> 4 at t=15; at t=30 the new replicas run, 16 in the system still: 4 needed, 4 there: hold
    c = cfg()
    d, st = decide(c, [s(0, 16), s(15, 16)], current=1, starting=0, now=15)
    assert (d.direction, d.desired) == (UP, 4)
    d, st = decide(c, [s(0, 16), s(15, 16), s(30, 16, running=4)], current=4, starting=0, now=30, state=st)
    assert d.direction == HOLD and d.desired == 4, d.reason


# --- rps: arrivals per second = (finished in the window + gained in the system) / its seconds
def r(at, finished, conc, running=1):
    return Sample(at=at, running_replicas=running, requests=float(finished + conc), finished=float(finished),
                  concurrency=float(conc))


def rps_cfg(**kw):
    return cfg(rules=[{"kind": "rps", "target": 3, "min_samples": 5}], **kw)


@pytest.mark.parametrize("second, want, why", [
    (r(15, 150, 30), 4, "(150 + 30 - 0) / 15 = 12/s; / 3 = 4 >= 2 x 1: a burst, 1 -> 4"),
    (r(15, 120, 0), 3, "(120 + 0) / 15 = 8/s; / 3 = 2.67 -> 3"),
    (r(15, 40, 5), 1, "(40 + 5) / 15 = 3/s: 1 replica, hold"),
    (r(15, 300, 600), 20, "a backlog still arriving: (300 + 600) / 15 = 60/s -> 20 (max_replicas)"),
])
def test_rps_counts_arrivals(second, want, why):
    d, _ = decide(rps_cfg(), [r(0, 0, 0), second], current=1, starting=0, now=15)
    assert d.desired == want, (why, d.reason)


def test_rps_does_not_count_a_backlog_twice_where_concurrency_does():
    # 4 replicas just came up (the step was at t=0) on a backlog of 200 that built while they
    # started; 14.8/s keep arriving. In the window (0, 15]: 410 finished, the system went from 200 to
    # 12: arrivals (410 + 12 - 200) / 15 = 14.8/s > 4 x 3 x 1.1 = 13.2 -> 5 (ceil 4.93).
    # At the sample before, 200 in the system: concurrency would have asked 50
    hist = [r(0, 0, 200, running=4), r(15, 410, 12, running=4)]
    d, _ = decide(rps_cfg(), hist, current=4, starting=0, now=15, state=PolicyState(last_step_at=0.0))
    assert (d.direction, d.desired) == (UP, 5), d.reason
    d, _ = decide(cfg(), hist[:1], current=4, starting=0, now=0)
    assert d.desired == 4  # no window covered yet: hold
    d, _ = decide(cfg(), [r(-15, 0, 0, running=4)] + hist[:1], current=4, starting=0, now=0)
    assert d.desired == 20, d.reason  # 200 / 4 = 50: concurrency takes the backlog for demand (max 20)


# --- the dead band (tolerance 0.1, HPA's): rps target 5, samples at 0 and 15
@pytest.mark.parametrize("rate, running, want, why", [
    (21.0, 4, 4, "21 <= 4 x 5 x 1.1 = 22: within the band, hold"),
    (22.5, 4, 5, "22.5 > 22: up to ceil(22.5 / 5) = 5"),
    (19.0, 4, 4, "ceil(19 / 5) = 4 = running: hold"),
    (19.0, 5, 5, "down only to ceil(19 / 4.5) = 5 (4 would each take 4.75 > 4.5): hold"),
    (17.0, 5, 4, "ceil(17 / 4.5) = 4: down to 4, each at 4.25 < 4.5"),
    (4.0, 5, 2, "ceil(4 / 4.5) = 1, but max_scale_down_rate 2 keeps floor(5 / 2) = 2"),
])
def test_a_dead_band_around_each_count(rate, running, want, why):
    hist = [r(0, 0, 0, running), r(15, rate * 15, 0, running)]
    c = cfg(rules=[{"kind": "rps", "target": 5, "min_samples": 5}])
    d, _ = decide(c, hist, current=running, starting=0, now=15)
    assert d.desired == want, (why, d.reason)


# --- the step rates: up to ceil(rate x running), down to floor(current / rate), and max_step if set
@pytest.mark.parametrize("extra, running, current, want_cap", [
    ({}, 1, 1, 20),                                   # rate 1000 x 1 = 1000; max_replicas 20 bounds
    ({"max_scale_up_rate": 2}, 1, 1, 2),              # ceil(2 x 1) = 2
    ({"max_scale_up_rate": 2.5}, 3, 3, 8),            # ceil(2.5 x 3) = ceil(7.5) = 8
    ({"max_scale_up_rate": 2}, 0, 0, 2),              # none running counts as 1: 2
    ({"max_step": 3}, 1, 1, 4),                       # 1 + 3
    ({"max_scale_up_rate": None}, 5, 5, 20),          # no rate: max_replicas
])
def test_up_bound(extra, running, current, want_cap):
    assert up_bound(cfg(**extra), running, current)[0] == want_cap


@pytest.mark.parametrize("extra, current, want_floor", [
    ({}, 8, 4),                                       # floor(8 / 2) = 4: at most half goes
    ({}, 3, 1),                                       # floor(1.5) = 1
    ({"min_replicas": 0}, 1, 0),                      # floor(0.5) = 0: scale to zero allowed
    ({"max_scale_down_rate": 4}, 8, 2),               # floor(8 / 4) = 2
    ({"max_scale_down_rate": None}, 8, 1),            # no rate: min_replicas
    ({"max_scale_down_rate": None, "max_step": 2}, 8, 6),  # 8 - 2
])
def test_down_bound(extra, current, want_floor):
    assert down_bound(cfg(**extra), current)[0] == want_floor


def test_a_rate_cuts_the_jump_and_says_so():
    d, _ = decide(cfg(max_scale_up_rate=2), [s(0, 40), s(15, 40)], current=1, starting=0, now=15)
    assert (d.direction, d.desired) == (UP, 2) and "max_scale_up_rate 2 x 1 running" in d.reason


@pytest.mark.parametrize("conc, current, want, why", [
    (4, 8, 4, "ceil(4 / 3.6) = 2 wanted, but at most half of 8 goes: 8 -> 4"),
    (12, 8, 4, "ceil(12 / 3.6) = 4 wanted: 8 -> 4"),
    (20, 8, 6, "down only to ceil(20 / (4 x 0.9)) = ceil(5.56) = 6: 8 -> 6 (>= floor 4)"),
    (0, 8, 4, "idle: to min_replicas 1, within the rate: 8 -> 4"),
])
def test_scale_in_goes_to_the_desired_count_within_the_rate(conc, current, want, why):
    hist = [s(0, conc, current, requests=conc or 0), s(15, conc, current, requests=conc or 0)]
    d, _ = decide(cfg(), hist, current=current, starting=0, now=15)
    assert (d.direction, d.desired) == (DOWN, want), (why, d.reason)


# --- scale in only after a stable window (scale_down_stabilization_s 60 here), never flapping
def test_scale_in_waits_for_its_stable_window_and_a_blip_restarts_it():
    c = cfg(scale_down_stabilization_s=60)
    st, hist, got = PolicyState(), [], []
    # 8 replicas; 8 in the system (2 needed) from t=0, a blip of 30 at t=45 (8 needed: hold), then 8 again
    load = {45: 30}
    for t in range(0, 181, 15):
        hist.append(s(t, load.get(t, 8), running=8))
        d, st = decide(c, hist, current=8, starting=0, now=t, state=st)
        got.append((t, d.direction))
    downs = [t for t, dirn in got if dirn == DOWN]
    # down votes from 15; the blip at 45 restarts the run at 60; 60 s held at 120: the first scale-in
    assert downs and downs[0] == 120, got
    assert UP not in [dirn for _, dirn in got]  # 30 / 4 = 8 = 8 running: the blip never scales up


def test_a_load_that_swings_around_the_count_never_flaps():
    # 4 running; load alternates 14 and 19 in the system: 19 > 4 x 4 x 1.1 = 17.6, up to 5 once; then
    # 14 asks ceil(14 / 3.6) = 4 and 19 asks 5: scale-in waits its 300 s window, which the swings
    # keep restarting. (17 instead of 19 is inside the band: nothing moves at all.)
    c = cfg(scale_down_stabilization_s=300)
    st, hist, cur, moves = PolicyState(), [], 4, []
    for i, t in enumerate(range(0, 1200, 15)):
        hist = (hist + [s(t, 19 if i % 2 else 14, running=cur)])[-40:]
        d, st = decide(c, hist, current=cur, starting=0, now=t, state=st)
        if d.desired != cur:
            moves.append(d.direction)
            cur = d.desired
    assert moves == [UP], moves


# --- a capacity block holds for as long as it does: nothing placed is no step
def test_a_blocked_scale_up_stays_up_on_every_recheck():
    # a 5 s interval, a 6 s panic window; blocked, it re-checks (and samples) every 3 s, and the
    # dry run places nothing each time. Without ``unstepped`` the state recorded a step that never
    # happened, the panic window restarted, and every other re-check held with no reason:
    # up, hold, up, hold... (issue 38: blocked true on about one step in three).
    c = cfg(stable_window_s=10, panic_window_s=6, interval_s=5)
    hist = [s(t, 16) for t in range(0, 43, 3)]
    got = {}
    for fix in (False, True):
        st, dirs = PolicyState(), []
        for now in range(12, 43, 3):
            before = st
            d, st = decide(c, [x for x in hist if x.at <= now], current=1, starting=0, now=now, state=before)
            dirs.append(d.direction)
            if fix and d.direction == UP:
                st = unstepped(before, st, now)  # what activities/autoscale.py keeps when 0 fit
        got[fix] = dirs
    assert got[True] == [UP] * 11, got[True]
    assert got[False] == [UP, HOLD] * 5 + [UP]  # the bug, as the policy alone shows it


def test_a_partly_placed_step_keeps_wanting_the_rest_until_fresh_samples():
    # 1 -> 4 wanted at t=15; 1 of 3 fits (2 replicas). The step restarts the windows; while no fresh
    # panic window exists, each re-check (every 3 s) still wants 4 and asks the scheduler again
    c = cfg(stable_window_s=15, panic_window_s=6, interval_s=5)
    d, st = decide(c, [s(0, 16), s(15, 16)], current=1, starting=0, now=15)
    assert (d.direction, d.desired) == (UP, 4)
    st = PolicyState(**{**st.__dict__, "wanted": 4})  # the caller: blocked, 2 of 4 placed
    hist = [s(0, 16), s(15, 16), s(18, 16)]
    d, st2 = decide(c, hist, current=2, starting=1, now=18, state=st)
    assert (d.direction, d.desired, d.rule) == (UP, 4, "wanted"), d.reason
    assert "4 wanted at the last step, 2 placed" in d.reason
    # at t=21 the panic window (15, 21] is covered after the step at 15: the rules judge again.
    # 16 in the system, 2 running: 4 needed, a burst (4 >= 2 x 2): up by the rule itself
    d, _ = decide(c, hist + [s(21, 16, running=2)], current=2, starting=0, now=21, state=st)
    assert (d.direction, d.desired, d.rule) == (UP, 4, "concurrency"), d.reason
    # and once fresh samples show 8 in the system (2 needed, 2 running): the rest is no longer wanted
    d, _ = decide(c, hist + [s(21, 8, running=2)], current=2, starting=0, now=21, state=st)
    assert d.direction == HOLD and d.desired == 2, d.reason


def test_unstepped_keeps_the_windows_and_the_up_run():
    before = PolicyState(direction=1, since=10.0, last_up_at=2.0, last_step_at=2.0)
    after = PolicyState(direction=1, since=30.0, last_up_at=30.0, last_step_at=30.0)
    assert unstepped(before, after, 30.0) == PolicyState(direction=1, since=10.0, last_up_at=2.0, last_step_at=2.0)
    fresh = unstepped(PolicyState(), after, 30.0)  # the first up of a run starts it now
    assert (fresh.since, fresh.last_step_at) == (30.0, None)


# --- what the system holds, each request once
@pytest.mark.parametrize("engines, gateway, want, why", [
    ([Window(running=2, waiting=3)], Window(running=5, waiting=4), 9.0, "gw queue 4 + max(engines 5, handed 5)"),
    ([Window(running=2, waiting=0)], Window(running=5, waiting=0), 5.0, "handed 5 > engines hold 2 (bypass none)"),
    ([Window(running=2, waiting=6)], None, 8.0, "no gateway: the engines' 2 + 6"),
    ([Window(ok=False), Window(running=1)], Window(running=0, waiting=2), 3.0, "a failed scrape counts nothing"),
])
def test_concurrency_counts_each_request_once(engines, gateway, want, why):
    assert combine(0.0, len(engines), engines, gateway).concurrency == want, why


def test_concurrency_travels_in_the_carry_and_a_bad_one_is_refused():
    x = s(15, 16)
    assert sample_in(json.loads(json.dumps(sample_out(x)))) == x
    d = sample_out(x)
    del d["concurrency"]  # a sample carried before the field: the evidence falls back to in flight + waiting
    assert sample_in(d).concurrency is None
    for bad in (-1, float("nan"), "lots"):
        with pytest.raises((ValueError, TypeError)):
            sample_in({**sample_out(x), "concurrency": bad})
    assert state_in({"wanted": 4}).wanted == 4 and state_in({}).wanted is None
    for bad in (-1, 10**6, "all"):
        with pytest.raises((ValueError, TypeError)):
            state_in({"wanted": bad})


# --- a step kept before the rates replays as it decided (no bound); a new one keeps its rates
def test_a_step_kept_before_the_rates_replays_unbounded():
    old = cfg(max_scale_down_rate=None, max_scale_up_rate=None, max_step=4,
              rules=[{"kind": "queue_tpot"}]).model_dump(mode="json")
    del old["max_scale_up_rate"], old["max_scale_down_rate"]  # as a build before issue 38 kept it
    idle = [Sample(at=0, running_replicas=8), Sample(at=15, running_replicas=8)]
    data = json.dumps({"v": kept.VERSION, "config": old, "samples": [sample_out(x) for x in idle], "current": 8,
                       "starting": 0, "now": 15, "state": {}}).encode()
    assert kept.replay(data)["desired"] == 4  # idle: 8 - max_step 4, as then; the rate would have said 4 too
    old["max_step"] = 8
    data = json.dumps({**json.loads(data), "config": old}).encode()
    assert kept.replay(data)["desired"] == 1  # 8 - 8 -> min_replicas 1: no rate halved it then
    new = cfg(max_step=8).model_dump(mode="json")
    data = json.dumps({**json.loads(data), "config": new}).encode()
    assert kept.replay(data)["desired"] == 4  # kept with its rate: floor(8 / 2)


def test_a_computed_step_is_kept_and_replays_the_same():
    c, hist = cfg(max_scale_up_rate=2), [s(0, 40), s(15, 40)]
    st = PolicyState(wanted=3)
    d, _ = decide(c, hist, current=1, starting=0, now=15, state=st)
    assert (d.direction, d.desired) == (UP, 2)  # 40 / 4 = 10, cut to ceil(2 x 1) by the rate
    got = kept.replay(kept.encode(c, hist, 1, 0, 15, st))
    assert got == kept.decision_of(d) and "max_scale_up_rate 2 x 1 running" in got["reason"]


@pytest.mark.parametrize("bad, field", [
    ({"max_scale_up_rate": 0.5}, "max_scale_up_rate"),
    ({"max_scale_down_rate": 0}, "max_scale_down_rate"),
    ({"rules": [{"kind": "concurrency", "target": 0}]}, "target"),
    ({"rules": [{"kind": "concurrency", "goal": 4}]}, "goal"),
])
def test_bad_rates_and_targets_are_refused_by_name(bad, field):
    with pytest.raises(ValueError, match=field):
        cfg(**bad)
