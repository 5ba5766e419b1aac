"""Per-role autoscaling of a prefill/decode group (scheduler/autoscale/roles.py) as tables: the
``autoscaling.roles`` block and what it refuses, each role deciding on its own signals (prefill on
TTFT or its queue, decode on ITL, TPOT or KV usage) with the evidence gates of every rule, the
gateways' role-blind view split by whose cost it is, and a role's step kept and replayed. Samples
come every 15 s; windows are one interval unless a row says otherwise."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from scheduler.autoscale import kept
from scheduler.autoscale.config import Autoscaling
from scheduler.autoscale.histogram import Histogram, quantile
from scheduler.autoscale.policy import PolicyState
from scheduler.autoscale.roles import autoscaling_problem, decide_roles, role_config, role_gateway
from scheduler.autoscale.signals import Sample, Window, combine
from tests.test_autoscale_policy import lat

INF = math.inf


def s(at, n=30.0, ttft=None, itl=None, kv=None, queue=0.0, tpot=None, running=1):
    """A 15 s sample of one role: ``n`` requests finished, each with the given TTFT, ITL gaps
    (10 a request) and mean TPOT; ``kv``: the engines' KV-cache usage."""
    return Sample(at=at, running_replicas=running, requests=n, finished=n, queue=queue,
                  ttft=lat(ttft, n) if ttft is not None else None, itl=lat(itl, 10 * n) if itl is not None else None,
                  tpot_sum=(tpot or 0.0) * 10 * n, tpot_count=10 * n if tpot is not None else 0.0, kv_usage=kv)


def block(prefill=None, decode=None, **kw):
    base = {"scale_down_stabilization_s": 0, "stable_window_s": 15, "panic_window_s": 15, "interval_s": 15}
    roles = {k: v for k, v in (("prefill", prefill), ("decode", decode)) if v is not None}
    return Autoscaling.model_validate({**base, **kw, "roles": roles})


# --- the block: each role's rules must measure that role's work; a group's bounds are per role
@pytest.mark.parametrize("raw, error", [
    ({"roles": {"prefill": {"max_replicas": 3}, "decode": {"max_replicas": 4, "rules": ["kv_usage", "itl"]}}}, None),
    ({"roles": {"decode": {"rules": ["ttft"]}}}, "autoscaling.roles.decode.rules: ttft does not measure a decode's"),
    ({"roles": {"prefill": {"rules": ["kv_usage"]}}}, "autoscaling.roles.prefill.rules: kv_usage does not measure"),
    ({"roles": {"decode": {"rules": ["itl", "itl"]}}}, "autoscaling.roles.decode.rules: a rule is given twice"),
    ({"roles": {"decode": {"min_replicas": 3, "max_replicas": 2}}}, "roles.decode: min_replicas 3 is above"),
    ({"roles": {"decode": {"min_replicas": 0}}}, "roles.decode.min_replicas"),  # a role runs at least one
    ({"roles": {"router": {}}}, "roles.router"),  # the router runs exactly one
    ({"max_replicas": 4, "roles": {"decode": {}}}, "autoscaling.max_replicas: a group is autoscaled per role"),
    ({"rules": ["itl"], "roles": {"decode": {}}}, "autoscaling.rules: a group is autoscaled per role"),
    ({"roles": {}}, "roles"),  # an empty roles block says nothing
])
def test_the_roles_block(raw, error):
    if error is None:
        Autoscaling.model_validate(raw)
        return
    with pytest.raises(ValidationError, match=error.replace(".", r"\.")):
        Autoscaling.model_validate(raw)


@pytest.mark.parametrize("raw, roles, problem", [
    ({}, None, None),  # a plain deployment's plain block
    ({"roles": {"decode": {}}}, None, "autoscaling.roles: only a prefill/decode group"),
    ({}, ["prefill", "decode"], "autoscaling: a prefill/decode group is autoscaled per role"),
    ({"roles": {"decode": {}}}, ["prefill", "decode", "router"], None),
    ({"roles": {"prefill": {}}}, ["decode"], "autoscaling.roles.prefill: the group has no prefill role"),
])
def test_a_block_fits_its_spec(raw, roles, problem):
    got = autoscaling_problem(Autoscaling.model_validate(raw), roles)
    assert (got is None) if problem is None else got.startswith(problem), got


def test_a_role_inherits_the_block_where_it_says_nothing():
    c = block(prefill={"max_replicas": 3}, decode={"max_replicas": 5, "max_step": 2, "rules": ["kv_usage"]},
              max_step=4, scale_up_stabilization_s=30)
    p, d = role_config(c, "prefill"), role_config(c, "decode")
    assert [r.kind for r in p.rules] == ["ttft"] and [r.kind for r in d.rules] == ["kv_usage"]  # prefill's default
    assert (p.max_replicas, p.max_step, d.max_step) == (3, 4, 2)  # the block's max_step unless the role's
    assert p.scale_up_stabilization_s == d.scale_up_stabilization_s == 30 and p.stable_window_s == 15


# --- each role on its own signals. Defaults: ttft P90 > 500 ms up, < 150 ms down; itl P90 > 50 ms
# up, < 20 ms down; kv_usage > 0.85 up, < 0.40 down; min_samples 20. Current 2 prefill, 2 decode.
BOTH = {"max_replicas": 6}


@pytest.mark.parametrize("prefill, decode, want, why", [
    ([s(0, ttft=0.3), s(15, ttft=0.3)], [s(0, itl=0.08), s(15, itl=0.08)], (2, 3),
     "TTFT 300 ms holds (150-500); ITL 80 ms > 50 ms: decode alone +1"),
    ([s(0, ttft=0.9), s(15, ttft=0.9)], [s(0, itl=0.03), s(15, itl=0.03)], (3, 2),
     "TTFT 900 ms > 500 ms: prefill alone +1; ITL 30 ms holds (20-50)"),
    ([s(0, ttft=0.9), s(15, ttft=0.9)], [s(0, itl=0.08), s(15, itl=0.08)], (3, 3), "both over: both +1"),
    ([s(0, ttft=0.1), s(15, ttft=0.1)], [s(0, itl=0.08), s(15, itl=0.08)], (1, 3),
     "TTFT 100 ms < 150 ms: prefill -1 while decode +1 (opposite ways in one step)"),
    ([s(0, ttft=0.3), s(15, ttft=0.3)], [s(0, n=10, itl=0.08, queue=1), s(15, n=10, itl=0.08, queue=1)], (2, 2),
     "10 + 1 waiting = 11 decode requests < min_samples 20: too few to judge, decode holds"),
    ([s(0, ttft=0.3), s(15, ttft=0.3)], [s(0, n=10, itl=0.08), s(15, n=10, itl=0.08)], (2, 1),
     "10 < 20 requests and none waiting: too little traffic to need 2 decodes, -1 (never up on so few)"),
    ([s(0, ttft=0.3), s(15, ttft=0.3)], [s(15, itl=0.08)], (2, 2),
     "decode's signals begin at 15: its window (0, 15] is not covered, it holds"),
    ([s(0, ttft=1.2), s(15, ttft=1.2)], [s(0, itl=0.2), s(15, itl=0.2)], (3, 3),
     "a burst of 2x the threshold is still one step each (up_step 1)"),
])
def test_each_role_decides_on_its_own_signals(prefill, decode, want, why):
    c = block(prefill=BOTH, decode=BOTH)
    got = decide_roles(c, {"prefill": prefill, "decode": decode}, {"prefill": 2, "decode": 2}, {}, 15, {})
    assert (got["prefill"][0].desired, got["decode"][0].desired) == want, why


@pytest.mark.parametrize("rules, decode, want, why", [
    (["kv_usage"], [s(0, kv=0.9), s(15, kv=0.9)], 3, "mean KV usage 90% > 85%: +1"),
    (["kv_usage"], [s(0, kv=0.8), s(15, kv=0.9)], 3, "only (0, 15] counts: the sample at 15, 90%"),
    (["kv_usage"], [s(0, kv=0.6), s(15, kv=0.6)], 2, "60% is inside 40-85%: hold"),
    (["kv_usage"], [s(0, kv=0.3), s(15, kv=0.3)], 1, "30% < 40% with 30 requests: -1"),
    (["kv_usage"], [s(0, kv=None), s(15, kv=None, n=30)], 2, "no engine publishes KV usage: no evidence, hold"),
    (["tpot"], [s(0, tpot=0.06), s(15, tpot=0.06)], 3, "mean TPOT 60 ms > 50 ms: +1"),
    (["tpot"], [s(0, tpot=0.01), s(15, tpot=0.01)], 1, "10 ms < 20 ms: -1"),
    (["itl", "kv_usage"], [s(0, itl=0.03, kv=0.9), s(15, itl=0.03, kv=0.9)], 3, "any rule up wins: KV 90%"),
    (["itl", "kv_usage"], [s(0, itl=0.01, kv=0.6), s(15, itl=0.01, kv=0.6)], 2,
     "down needs every rule: ITL 10 ms votes down, KV 60% holds"),
])
def test_decode_rules(rules, decode, want, why):
    c = block(decode={"max_replicas": 6, "rules": rules})
    got = decide_roles(c, {"decode": decode}, {"prefill": 1, "decode": 2}, {}, 15, {})
    assert set(got) == {"decode"} and got["decode"][0].desired == want, (why, got["decode"][0].reason)


@pytest.mark.parametrize("queue, want, why", [
    (4.0, 3, "4 waiting per prefill >= 4: +1"),
    (3.9, 2, "3.9 < 4: hold"),
    (0.5, 1, "0.5 <= 0.5 with 30 requests: -1"),
])
def test_prefill_queue_rule(queue, want, why):
    c = block(prefill={"max_replicas": 6, "rules": ["queue"]})
    got = decide_roles(c, {"prefill": [s(0, queue=queue), s(15, queue=queue)]}, {"prefill": 2, "decode": 1}, {}, 15, {})
    assert got["prefill"][0].desired == want, why


def test_a_role_steps_and_its_state_are_its_own():
    # at 15: TTFT 300 ms holds the prefill, ITL 80 ms adds a decode (2 -> 3): only decode's state
    # records the step (last_step_at 15); its next window starts afresh
    c = block(prefill=BOTH, decode=BOTH)
    hist = {"prefill": [s(0, ttft=0.3), s(15, ttft=0.3)], "decode": [s(0, itl=0.08), s(15, itl=0.08)]}
    got = decide_roles(c, hist, {"prefill": 2, "decode": 2}, {}, 15, {})
    assert (got["prefill"][0].desired, got["decode"][0].desired) == (2, 3)
    assert got["prefill"][1].last_step_at is None and got["decode"][1].last_step_at == 15
    # at 30: TTFT 900 ms and ITL still 80 ms. The new decode is still starting: running 2 + 1 = 3 is
    # covered by the 3 it has, decode holds; the prefill is not held by it and adds one (2 -> 3)
    hist["prefill"].append(s(30, ttft=0.9))
    hist["decode"].append(s(30, itl=0.08))
    again = decide_roles(c, hist, {"prefill": 2, "decode": 3}, {"decode": 1}, 30,
                         {r: st for r, (_, st) in got.items()})
    assert again["prefill"][0].desired == 3
    assert again["decode"][0].desired == 3 and "still starting" in again["decode"][0].reason


# --- the gateways' view is role-blind: TTFT, queueing and the queue are the prefill's, ITL the decode's
def test_the_gateways_view_is_split_by_whose_cost_it_is():
    slow_first, slow_gaps = lat(0.9, 30), lat(0.08, 300)
    gw = Window(waiting=6.0, running=2.0, ttft=slow_first, tpot=slow_gaps, latency=lat(2.0, 30))
    p = combine(15, 1, [Window()], role_gateway("prefill", gw))  # an engine without metrics (404)
    d = combine(15, 1, [Window(kv_usage=0.5)], role_gateway("decode", gw))
    assert quantile(p.ttft, 0.9) == pytest.approx(0.9, abs=0.001) and p.itl is None and p.queue == 6.0
    assert d.ttft is None and quantile(d.itl, 0.9) == pytest.approx(0.08, abs=0.001) and d.queue == 0.0
    assert p.requests == d.requests == 32.0  # 30 finished + 2 in flight: both roles' evidence gate
    assert d.kv_usage == 0.5 and p.kv_usage is None


def test_the_engines_own_signals_come_first_and_kv_is_their_mean():
    # two decodes at 30% and 90% KV: mean 60%; a third whose scrape failed is left out (and makes
    # the sample incomplete); their own ITL (20 ms) is used, not the gateway's (80 ms)
    mine = lat(0.02, 100)
    engines = [Window(kv_usage=0.3, tpot=mine), Window(kv_usage=0.9), Window(ok=False)]
    d = combine(15, 3, engines, role_gateway("decode", Window(tpot=lat(0.08, 300))))
    assert d.kv_usage == pytest.approx(0.6) and not d.complete
    assert quantile(d.itl, 0.9) == pytest.approx(0.02, abs=0.001)


def test_a_role_step_is_kept_and_replays_the_same():
    c = block(prefill=BOTH, decode=BOTH)
    hist = [s(0, itl=0.08), s(15, itl=0.08)]
    d, _ = decide_roles(c, {"decode": hist}, {"prefill": 2, "decode": 2}, {}, 15, {})["decode"]
    data = kept.encode(role_config(c, "decode"), hist, 2, 0, 15, PolicyState(), role="decode")
    assert kept.worth_keeping(d) and kept.replay(data) == kept.decision_of(d, "decode")
    assert kept.replay(data)["role"] == "decode" and kept.replay(data)["desired"] == 3
    bad = data.replace(b'"role":"decode"', b'"role":"router"')
    with pytest.raises(Exception, match="role 'router' is not prefill or decode"):
        kept.replay(bad)


def test_a_sample_from_before_these_fields_decodes():
    from scheduler.autoscale.codec import sample_in, sample_out
    old = {"at": 15, "running_replicas": 1, "requests": 3}
    got = sample_in(old)
    assert (got.ttft, got.itl, got.kv_usage) == (None, None, None)
    back = sample_in(sample_out(s(15, ttft=0.3, itl=0.04, kv=0.7)))
    assert back.kv_usage == 0.7 and quantile(back.ttft, 0.9) == pytest.approx(0.3, abs=0.001)
    with pytest.raises(ValueError, match="kv_usage 1.5"):
        sample_in({**old, "kv_usage": 1.5})
    assert isinstance(back.itl, Histogram)


# --- a role's scale-up asks the scheduler first: one more member placed alone beside the group
@pytest.mark.parametrize("role, k, fits, why", [
    ("decode", 1, 1, "GPU 0 holds the prefill's 10 of 24 GiB: 14 free, one more 10 GiB decode fits"),
    ("decode", 2, 2, "the first booked on GPU 0, the second on GPU 1 (14 free beside the decode)"),
    ("decode", 3, 2, "both GPUs then hold 20 of 24 GiB: the third does not fit: blocked, saying why"),
    ("prefill", 3, 2, "the same host for the other role: its own dry run, the same arithmetic"),
])
def test_a_role_adds_only_the_members_that_fit(role, k, fits, why):
    from scheduler.autoscale.fit import fit_member
    from tests.conftest import cluster
    from tests.test_group_scale import REQ, group, host, member

    snap = cluster([host("a")], [member("g-0", "prefill", "a", 0), member("g-1", "decode", "a", 1)])
    f = fit_member(snap, group(), role, REQ, "g", k)
    assert (f.fits, f.blocked) == (fits, fits < k), why
    assert sorted(p.gpu_indexes[0] for p in f.placed) == list(range(fits))
    if f.blocked:
        assert f.reasons[0] == f"role {role}: no host fits one more member" and "10.0 GiB of VRAM" in f.reasons[1]


def test_both_roles_dry_runs_in_one_step_share_the_free_gpus():
    # host a, 2 GPUs of 24 GiB, each holding one 10 GiB member: 14 GiB free on each. The prefill's
    # dry run takes both (2 fit); the decode's, on the snapshot it leaves, finds 4 GiB: none fits,
    # so the two roles never both count on the same free GPU
    from scheduler.autoscale.fit import fit_member
    from tests.conftest import cluster
    from tests.test_group_scale import REQ, group, host, member

    snap = cluster([host("a")], [member("g-0", "prefill", "a", 0), member("g-1", "decode", "a", 1)])
    p = fit_member(snap, group(), "prefill", REQ, "g", 2)
    d = fit_member(p.after, group(), "decode", REQ, "g", 1)
    assert (p.fits, d.fits, d.blocked) == (2, 0, True)
    assert [(i.role.value, i.group) for i in p.after.instances[-2:]] == [("prefill", "g"), ("prefill", "g")]
