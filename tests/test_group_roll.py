"""A prefill/decode group's roll, its pure parts (issue 35): the whole roll's next step
(scheduler/rollout.py ``next_whole_step``) as a table, and the rollout state a group's edits leave
(workflows/rollout_steps.py ``change_spec``, ``roll_back``, ``undo_raw``): which way, which roles,
which generation new members join."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from scheduler.rollout import DONE, FORM, ROLLBACK, STOP, WAIT, Replica, RolloutConfig, next_whole_step
from scheduler.spec import ModelSpec
from workflows import rollout_steps as ro

CFG = RolloutConfig(surge_timeout_s=60, failure_threshold=3)


def rep(name: str, ready: bool = True, state: str = "running", restarts: int = 0) -> Replica:
    return Replica(name, state, ready, restarts)


O2 = [rep("o-p"), rep("o-d")]  # the old generation: a prefill and a decode, serving
# (row, old, new, named, forming since, now, action, names stopped, fallback)
WHOLE = [
    ("nothing of the new generation yet: form it", O2, [], 0, None, 100, FORM, [], False),
    ("named, unplaced for 59 s < 60: form again", O2, [], 2, 41, 100, FORM, [], False),
    # unplaced for 100 - 40 = 60 s >= surge_timeout_s 60: the old generation goes first
    ("unplaced for 60 s: stop-first", O2, [], 2, 40, 100, STOP, ["o-p", "o-d"], True),
    ("placed, one not ready: wait", O2, [rep("n-p"), rep("n-d", ready=False, state="starting")], 0, None, 100, WAIT,
     [], False),
    # 2 new ready >= 2 desired: the whole old generation drains at once
    ("every new member ready: the old generation goes", O2, [rep("n-p"), rep("n-d")], 0, None, 100, STOP,
     ["o-p", "o-d"], False),
    ("no old left, every new ready: done", [], [rep("n-p"), rep("n-d")], 0, None, 100, DONE, [], False),
    ("a new member ERROR: roll back", O2, [rep("n-p"), rep("n-d", False, "error")], 0, None, 100, ROLLBACK, [],
     False),
    # restarts 3 >= failure_threshold 3
    ("a new member restarted 3 times: roll back", O2, [rep("n-p", restarts=3), rep("n-d")], 0, None, 100, ROLLBACK,
     [], False),
    ("the old gone by stop-first, the new one forms", [], [], 2, 40, 100, FORM, [], False),
]


@pytest.mark.parametrize("row,old,new,named,since,now,action,names,fallback", WHOLE, ids=[w[0] for w in WHOLE])
def test_the_whole_rolls_next_step(row, old, new, named, since, now, action, names, fallback):
    s = next_whole_step(CFG, 2, old, new, named, since, now)
    assert (s.action, s.names, s.fallback) == (action, names, fallback), (row, s)


@pytest.fixture(autouse=True)
def clock(monkeypatch):
    monkeypatch.setattr(ro.workflow, "now", lambda: datetime(2025, 1, 1, tzinfo=timezone.utc))


def group(**kw) -> dict:
    base = {"name": "pd", "backend": "custom", "run_command": "serve --port {port}", "source": {"local_path": "/m"},
            "disaggregation": {"mode": "custom"}, "roles": [{"name": "prefill"}, {"name": "decode"}]}
    return ModelSpec.model_validate({**base, **kw}).model_dump(mode="json", exclude_none=True)


class Deployment:
    """The deployment workflow's calls in a group's rollout, without the workflow."""

    def __init__(self):
        self.raw = group()
        self.ro = ro.state_from(None)
        ro.begin(self.ro, self.raw)

    def edit(self, new: dict) -> ro.Change:
        c = ro.change_spec(self.ro, self.raw, new, ModelSpec.model_validate(new), ModelSpec.model_validate(self.raw))
        self.raw = c.raw
        return c


DECODE_ENV = [{"name": "prefill"}, {"name": "decode", "env": {"OMP_NUM_THREADS": "2"}}]
PREFILL_ENV = [{"name": "prefill", "env": {"OMP_NUM_THREADS": "2"}}, {"name": "decode", "env": {"OMP_NUM_THREADS": "2"}}]


def test_a_roles_edit_keeps_the_generation_and_a_whole_one_bumps_it():
    d = Deployment()
    d.edit(group(roles=DECODE_ENV))
    assert (d.ro.way, d.ro.roles, d.ro.gen, d.ro.rolling) == ("roles", ["decode"], 0, True)
    ro.done(d.ro, "ok", set())
    d.edit(group(roles=DECODE_ENV, source={"local_path": "/m2"}))  # the model: whole, generation 0 + 1
    assert (d.ro.way, d.ro.gen, d.ro.good_gen) == ("whole", 1, 0) and "the model changes" in d.ro.why
    good = ro.roll_back(d.ro, "rolled back: pd-3 is ERROR")  # back to the generation still serving
    assert good is not None and good["source"] == {"local_path": "/m"} and d.ro.gen == 0 and d.ro.version == 1


def test_an_edit_during_a_roll_is_judged_from_the_spec_before_it_too():
    d = Deployment()
    d.edit(group(roles=DECODE_ENV))  # decode rolling (from version 0)
    d.edit(group(roles=PREFILL_ENV))  # now prefill's env: decode keeps rolling, prefill joins, in order
    assert (d.ro.way, d.ro.roles) == ("roles", ["prefill", "decode"]), d.ro.why
    d = Deployment()
    d.edit(group(source={"local_path": "/m2"}))  # whole, generation 1
    d.edit(group(source={"local_path": "/m2"}, roles=DECODE_ENV))  # a roles edit mid-whole: whole again, gen 2
    assert (d.ro.way, d.ro.gen) == ("whole", 2) and "the roll under way is whole" in d.ro.why, d.ro.why
    # TP: version 0 P1 D1 -> P2 D1 (prefill rolling) -> P2 D2 mid-roll: an old prefill (1) would meet a new
    # decode (2): 1 -> 2 is neither 1 -> 1 nor 2 -> 2, judged from version 0's spec: whole
    d = Deployment()
    d.edit(group(roles=[{"name": "prefill", "backend_parameters": ["--tp", "2"]}, {"name": "decode"}]))
    assert (d.ro.way, d.ro.roles) == ("roles", ["prefill"])
    d.edit(group(backend_parameters=["--tp", "2"]))
    assert d.ro.way == "whole" and "before the roll under way: prefill TP against decode TP" in d.ro.why, d.ro.why


def test_replicas_restart_nothing_and_recreate_bumps_the_generation():
    d = Deployment()
    c = d.edit(group(roles=[{"name": "prefill", "replicas": 3}, {"name": "decode"}], autoscaling=None))
    assert (c.recreate, d.ro.rolling, d.ro.version) == (False, False, 0)
    c = d.edit(group(roles=DECODE_ENV, rollout={"strategy": "recreate"}))
    assert (c.recreate, d.ro.way, d.ro.gen) == (True, "recreate", 1)


def test_undo_keeps_each_roles_replicas_today():
    to = ro.Outcome(version=0, result="good", spec=ModelSpec.model_validate(group()))
    now = group(roles=[{"name": "prefill", "replicas": 3}, {"name": "decode", "replicas": 2}])
    assert [(r["name"], r["replicas"]) for r in ro.undo_raw(to, now, 5)["roles"]] == [("prefill", 3), ("decode", 2)]


def test_gpuflow_deploy_warns_which_way_a_group_edit_rolls():
    from gpuflow.deploy_report import FILE, report
    before = {"spec": group(), "replicas": 2}
    r = report("pd", before, group(roles=DECODE_ENV), 2, FILE, True)
    assert r.warnings == ["warning: this change of group pd rolls role by role (decode): decode: env changes; the KV "
                          "hand-off does not depend on it; follow it with 'gpuflow rollout status pd'"], r.warnings
    r = report("pd", before, group(source={"local_path": "/m2"}), 2, FILE, True)
    assert r.warnings[0].startswith("warning: this change of group pd rolls the group whole (a new generation beside "
                                    "the old): the model changes (prefill, decode: source)"), r.warnings


def test_a_formation_still_waiting_is_logged_once_and_status_shows_the_way():
    d = Deployment()
    d.edit(group(source={"local_path": "/m2"}))
    for _ in range(3):  # three passes, the new generation unplaced each time: one line
        ro.log_step(d.ro, "form_new", [], "forming the new generation (2 member(s)) beside 2 old; waiting: no room")
    assert [s.action for s in d.ro.steps] == ["begin", "form_new"]
    from gpuflow.cli.rollout import render
    v = ro.view(d.ro, "pd", 2, [], set()).model_dump(mode="json")
    assert "  group generation 1: rolls the group whole (a new generation beside the old): the model changes" \
        in render(v), render(v)
