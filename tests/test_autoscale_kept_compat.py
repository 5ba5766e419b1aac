"""Steps decided before issue 38 replay the same (``gpuflow explain --replay`` says "same decision"):
the policy as issue 38 found it (read from git by bench/policy_at.py) and today's, on the same
samples, with a block as it was kept then (``max_step`` 4, no step rates: kept.replay reads a block
without the rates so), give the same decision, word for word, at every step of 10 hours of the
bench's day (bench/bench_autoscaler.py's traffic and engine model, each threshold rule). Skipped
where the repository's history cannot be read."""

from __future__ import annotations

import os
import sys
from dataclasses import asdict
from types import SimpleNamespace

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import bench_autoscaler as bench  # noqa: E402
import policy_at  # noqa: E402
from scheduler.autoscale import kept  # noqa: E402

HOURS = 10


@pytest.fixture(scope="module")
def kits():
    try:
        policy_at.load(bench.BEFORE_38)
    except policy_at.NoHistory as e:
        pytest.skip(str(e))
    k = bench.kits()
    return k["before 38"], k["now"]


@pytest.fixture(scope="module")
def traffic():
    return [a for a in bench.arrivals() if a[0] < HOURS * 3600]


@pytest.mark.parametrize("name", ["latency_p95 (defaults)", "latency_p95 (0.5 s / 0.25 s)",
                                  "queue_tpot (fit to this engine)"])
def test_the_policy_before_38_and_now_decide_alike_on_a_block_kept_then(kits, traffic, name):
    old, new = kits
    raw = {"min_replicas": 1, "max_replicas": 10, **bench.CONFIGS[name]}
    old_cfg = old.Autoscaling.model_validate(raw)
    new_cfg = new.Autoscaling.model_validate({**raw, "max_step": 4, "max_scale_up_rate": None,
                                              "max_scale_down_rate": None})
    seen = {"steps": 0, "moves": 0}

    def decide(_cfg, hist, current, starting, at, state):
        d0, s0 = old.decide(old_cfg, [h[0] for h in hist], current, starting, at, state[0])
        d1, s1 = new.decide(new_cfg, [h[1] for h in hist], current, starting, at, state[1])
        assert kept.decision_of(d1) == kept.decision_of(d0), (at, d0.reason, d1.reason)
        assert {k: v for k, v in asdict(s1).items() if k != "wanted"} == asdict(s0), at
        seen["steps"] += 1
        seen["moves"] += d0.desired != current
        return d0, (s0, s1)

    both = SimpleNamespace(decide=decide, State=lambda: (old.State(), new.State()),
                           sample=lambda *a: (old.sample(*a), new.sample(*a)))
    bench.simulate(both, old_cfg, traffic, HOURS * 3600)
    assert seen["steps"] == HOURS * 240 and seen["moves"] >= 3, seen  # a decision every 15 s; it did scale
