"""What ``gpuflow deploy`` says it changed and where its replica count comes from (pure), and the
``--wait`` verdict over what status shows (pure). The live exit codes: tests/test_deploy_wait_live.py."""

from __future__ import annotations

import pytest

from gpuflow.deploy_report import DEFAULT, FILE, FLAG, KEPT, changed_fields, replicas_to_apply, report
from gpuflow.deploy_wait import judge
from scheduler.reasons import pending_text


@pytest.mark.parametrize("named, file_n, flag, current, want", [
    (True, 2, None, 3, (2, FILE)),  # the file names 2; scaled to 3 since: the file wins (kubectl apply)
    (False, 1, None, 3, (3, KEPT)),  # the file names none: the running count stays
    (False, 1, None, None, (1, DEFAULT)),  # new, none named: the spec's default
    (True, 2, 5, 3, (5, FLAG)),  # the flag beats the file
    (False, 1, 0, 3, (0, FLAG)),  # a flag of 0 is a count, not "unset"
])
def test_where_the_replica_count_comes_from(named, file_n, flag, current, want):
    assert replicas_to_apply(named, file_n, flag, current) == want


SPEC = {"name": "echo", "backend": "custom", "run_command": "srv {port}", "replicas": 2}


@pytest.mark.parametrize("before, after, n, source, rolls, said, warned", [
    (None, SPEC, 2, FILE, False, ["deployment echo: created, 2 replica(s) wanted (the file)"], []),
    ({"spec": SPEC, "replicas": 2}, SPEC, 2, FILE, False, ["deployment echo: nothing changed (2 replica(s))"], []),
    # scaled 2 -> 3 by hand, the same file again: back to 2, said on stdout and warned on stderr
    ({"spec": SPEC, "replicas": 3}, SPEC, 2, FILE, False, ["deployment echo: replicas 3 -> 2 from the file"],
     ["was scaled to 3 since its last deploy"]),
    # the file's own count changed (2 -> 4) with no scale between: said, no warning
    ({"spec": SPEC, "replicas": 2}, {**SPEC, "replicas": 4}, 4, FILE, False,
     ["deployment echo: replicas 2 -> 4 from the file"], []),
    # replicas left out of the file: kept at 3, nothing to say about them
    ({"spec": SPEC, "replicas": 3}, {**SPEC, "replicas": 3}, 3, KEPT, False,
     ["deployment echo: nothing changed (3 replica(s))"], []),
    # run_command changed: a rolling upgrade, warned
    ({"spec": SPEC, "replicas": 2}, {**SPEC, "run_command": "srv2 {port}"}, 2, FILE, True,
     ["deployment echo: spec changed (run_command)"], ["a rolling upgrade"]),
    # strategy recreate: everything stops at once, warned so
    ({"spec": SPEC, "replicas": 2}, {**SPEC, "env": {"A": "1"}, "rollout": {"strategy": "recreate"}}, 2, FILE, True,
     ["deployment echo: spec changed (env, rollout)"], ["strategy recreate stops them all now"]),
    # a field that does not roll (priority): said, no warning
    ({"spec": SPEC, "replicas": 2}, {**SPEC, "priority": 5}, 2, FILE, False,
     ["deployment echo: spec changed (priority)"], []),
])
def test_what_deploy_says(before, after, n, source, rolls, said, warned):
    r = report("echo", before, after, n, source, rolls)
    assert r.said == said
    assert len(r.warnings) == len(warned) and all(w in line for w, line in zip(warned, r.warnings)), r.warnings


def test_changed_fields_leave_replicas_to_their_own_line():
    assert changed_fields({"a": 1, "replicas": 2}, {"a": 1, "replicas": 3, "b": 0}) == ["b"]


def row(*states_reasons, replicas=None):
    insts = [{"name": f"m-{k}", "state": s, "reason": r} for k, (s, r) in enumerate(states_reasons)]
    return {"name": "m", "replicas": len(insts) if replicas is None else replicas, "instances": insts}


IDLE = {"rolling": False, "old": [], "stopping": [], "status": "no rollout yet"}
NOFIT = pending_text(["No workers meet the resource requirements.", "The largest GPU has 80.0 GiB."], 2)


@pytest.mark.parametrize("dep, rollout, code, first", [
    (row(("running", ""), ("running", "")), IDLE, 0, "deployment m: 2 of 2 replica(s) RUNNING"),
    (row(("running", ""), ("starting", "")), IDLE, None, "deployment m: RUNNING 1, STARTING 1 of 2 wanted"),
    (row(("running", ""), replicas=2), IDLE, None, "deployment m: RUNNING 1 of 2 wanted"),  # one not made yet
    # every replica RUNNING, but the rollout still has an old one to drain: not done
    (row(("running", ""), ("running", "")), {**IDLE, "rolling": True, "old": ["m-0"]}, None,
     "deployment m: RUNNING 2 of 2 wanted (rolling)"),
    (row(("running", ""), ("pending", NOFIT)), IDLE, 3,
     "m-1: PENDING: unschedulable: No workers meet the resource requirements; The largest GPU has 80.0 GiB"),
    (row(("pending", "quota: tenant poc uses 2 of its 2 GPUs (this replica needs 1)")), IDLE, 3,
     "m-0: PENDING: quota: tenant poc uses 2 of its 2 GPUs (this replica needs 1)"),
    (row(("pending", "")), IDLE, None, "deployment m: PENDING 1 of 1 wanted"),  # not decided yet
    (row(replicas=2), IDLE, None, "deployment m: no replica made yet of 2 wanted"),  # just created
    # ERROR beats a replica waiting for room: the failure is the news
    (row(("pending", NOFIT), ("error", "exited with code 3 while starting: engine: refusing to start")), IDLE, 1,
     "m-1: ERROR: exited with code 3 while starting: engine: refusing to start"),
    (row(("running", "")), {**IDLE, "status": "rolled back", "history": [{"reason": "m-3 restarted 3 times"}]}, 1,
     "deployment m: its rollout was rolled back: m-3 restarted 3 times"),
])
def test_the_wait_verdict(dep, rollout, code, first):
    v = judge(dep, rollout)
    assert (v.code, v.lines[0]) == (code, first)
    assert ".;" not in v.lines[0]  # issue 26 point 5: the reasons' full stops no longer run into '; '


GROUP = {"name": "pd", "backend": "custom", "run_command": "srv {port}", "replicas": 1,
         "roles": [{"name": "prefill", "replicas": 2}, {"name": "decode"}]}  # 2 + 1 = 3 members


@pytest.mark.parametrize("before, after, n, said", [
    # on -> off: its 3 members stop, roles kept (the group's own replicas is not a member count)
    ({"spec": GROUP, "replicas": 3}, {**GROUP, "replicas": 0}, 0,
     "deployment pd: the group switched off (replicas 0): its 3 member(s) stop, its roles kept"),
    # off -> on: 2 prefills + 1 decode = 3 members formed whole
    ({"spec": {**GROUP, "replicas": 0}, "replicas": 0}, GROUP, 3,
     "deployment pd: the group switched on (replicas 1): 3 member(s) form whole"),
    # switched off mid-roll: both generations' 4 members stop
    ({"spec": GROUP, "replicas": 3, "members": 4}, {**GROUP, "replicas": 0}, 0,
     "deployment pd: the group switched off (replicas 0): its 4 member(s) stop, its roles kept"),
    # a new group created off: 0 wanted, nothing starts
    (None, {**GROUP, "replicas": 0}, 0,
     "deployment pd: created, 0 replica(s) wanted (its roles) (the group is off: replicas 0, nothing starts)"),
])
def test_what_deploy_says_of_a_group_switched_off_or_on(before, after, n, said):
    assert report("pd", before, after, n, "its roles", False).said == [said]


EDITED = {**GROUP, "run_command": "srv2 {port}"}


@pytest.mark.parametrize("before, after, n, said, warns", [
    # on, and on: the edit rolls its members (the warning names the way)
    ({"spec": GROUP, "replicas": 3}, EDITED, 3, ["deployment pd: spec changed (run_command)"], True),
    # off, and off: no member runs the old spec, nothing rolls
    ({"spec": {**GROUP, "replicas": 0}, "replicas": 0}, {**EDITED, "replicas": 0}, 0,
     ["deployment pd: spec changed (run_command)",
      "deployment pd: the group is off: no member rolls; its members start with this spec when it is switched on"],
     False),
    # off -> on with an edit: its members form whole with the new spec
    ({"spec": {**GROUP, "replicas": 0}, "replicas": 0}, EDITED, 3,
     ["deployment pd: the group switched on (replicas 1): 3 member(s) form whole",
      "deployment pd: spec changed (run_command)",
      "deployment pd: its members form with this spec: nothing rolls"], False),
    # on -> off with an edit: its members stop; nothing rolls
    ({"spec": GROUP, "replicas": 3}, {**EDITED, "replicas": 0}, 0,
     ["deployment pd: the group switched off (replicas 0): its 3 member(s) stop, its roles kept",
      "deployment pd: spec changed (run_command)",
      "deployment pd: the group is off: no member rolls; its members start with this spec when it is switched on"],
     False),
])
def test_an_edit_to_a_group_with_no_member_running_rolls_nothing(before, after, n, said, warns):
    r = report("pd", before, after, n, "its roles", True)
    assert r.said == said and bool(r.warnings) == warns, (r.said, r.warnings)


def test_the_wait_verdict_on_a_group_switched_off_is_at_once():
    off = {"name": "pd", "replicas": 0, "wanted": 0, "instances": [], "group": {"off": True, "roles": "prefill 0/2"}}
    assert (judge(off, IDLE).code, judge(off, IDLE).lines) == (0, [
        "deployment pd: the group is off (replicas 0); 'gpuflow scale pd 1' switches it on"])
    stopping = {**off, "instances": [{"name": "pd-0", "state": "stopping", "reason": ""}]}  # 1 left to stop
    assert judge(stopping, {**IDLE, "rolling": True}).lines[0].startswith(
        "deployment pd: the group is off (replicas 0) (1 member(s) still stopping)")


def test_a_failure_says_its_innermost_cause_never_just_activity_task_failed():
    from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError
    from temporalio.exceptions import ActivityError, ApplicationError

    from gpuflow.broken import cause_message
    from gpuflow.ops import _update_error

    why = "role prefill: /tmp/trial-run/model: no config.json: not a Hugging Face model directory"
    act = ActivityError("Activity task failed", scheduled_event_id=5, started_event_id=6, identity="w",
                        activity_type="form_group", activity_id="1", retry_state=None)
    act.__cause__ = ApplicationError(why, type="ModelError", non_retryable=True)  # as Temporal's converter nests it
    assert cause_message(WorkflowFailureError(cause=act)) == why
    assert str(_update_error(WorkflowUpdateFailedError(act))) == why
    bare = ActivityError("Activity task failed", scheduled_event_id=5, started_event_id=6, identity="w",
                         activity_type="form_group", activity_id="1", retry_state=None)
    assert cause_message(WorkflowFailureError(cause=bare)) == "Activity task failed"  # nothing inside: its own words
