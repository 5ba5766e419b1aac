"""`gpuflow rollout undo` never re-applies a failure (issue 25): the versions a deployment keeps,
how each ended, and where undo goes, driven through the rollout's own state functions
(workflows/rollout_steps.py) with a stand-in for the deployment workflow.

The rule: undo goes to the newest kept version older than the current one that was good (or
deployed without a rollout), skipping every version rolled back for failing, one whose spec
failed again later, one never finished and one with the current spec, and says which it
skipped; with none, it is refused with the reason. A second undo goes back to the version the
first one left (as ``kubectl rollout undo``), never to a failure."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from temporalio.exceptions import ApplicationError

from scheduler.spec import ModelSpec
from workflows import rollout_steps as ro


def spec(v: str, **kw) -> dict:
    return ModelSpec.model_validate({"name": "chat", "backend": "custom", "run_command": f"serve --port {{port}} --name {v}",
                                     "replicas": 1, "source": {"local_path": "/models/chat"},
                                     "resources": {"vram": 2**30, "ram": 2**30}, **kw}).model_dump(mode="json", exclude_none=True)


@pytest.fixture(autouse=True)
def clock(monkeypatch):
    t = [datetime(2025, 1, 1, tzinfo=timezone.utc)]
    monkeypatch.setattr(ro.workflow, "now", lambda: t[0])
    return t


class Deployment:
    """The deployment workflow's part in a rollout: its spec, the rollout state, and the calls
    workflows/deployment.py makes (update_spec, the rollout loop's done/rollback, rollout_undo)."""

    def __init__(self, v: str, carried: dict | None = None, raw: dict | None = None):
        self.raw, self.replicas, self.instances, self.stopping, self.name = raw or spec(v), 1, [], set(), "chat"
        self.dirty = self.recreate = False
        self.ro = ro.state_from(carried)
        ro.begin(self.ro, self.raw)

    def _change(self, new: dict, undo=None) -> None:
        change = ro.change_spec(self.ro, self.raw, new, ModelSpec.model_validate(new),
                                ModelSpec.model_validate(self.raw), undo)
        self.raw, self.recreate = change.raw, self.recreate or change.recreate

    def deploy(self, v: str, **kw) -> "Deployment":
        self._change(spec(v, **kw))
        return self

    def finish(self) -> "Deployment":
        ro.done(self.ro, "1 new replica(s) ready", set(self.instances) | self.stopping)
        return self

    def fail(self) -> "Deployment":
        good = ro.roll_back(self.ro, f"rolled back: chat-{self.ro.version} is ERROR")
        if good is not None:
            self.raw, self.dirty = good, True
        return self

    def undo(self) -> "Deployment":
        to, said = ro.undo_choice(self.ro)
        if to is None:
            raise ValueError(f"nothing to undo to: {said}")
        self._change({**to.raw(), "replicas": self.replicas}, (to, said))
        return self

    @property
    def running(self) -> str:  # the name in the current spec's command
        return self.raw["run_command"].rsplit(" ", 1)[-1]

    def results(self) -> list[tuple[int, str]]:
        return [(h.version, h.result) for h in self.ro.history]


def test_undo_after_a_rollback_lands_on_the_good_version_before_the_current_one():
    # the case: v1 -> v2 -> v3 fails (rolled back to v2); undo re-applied v3
    d = Deployment("v1").deploy("v2").finish().deploy("v3").fail().finish()
    assert d.running == "v2" and d.ro.version == 1
    assert d.results() == [(0, "deployed"), (1, "good"), (2, "rolled back")]
    to, said = ro.undo_choice(d.ro)
    assert to.version == 0 and said.startswith("version 0's spec (deployed at 2025-01-01T00:00:00+00:00)")
    assert "skipped version 2 (rolled back: chat-2 is ERROR)" in said  # and it says so
    d.undo()
    assert d.running == "v1" and d.ro.version == 3 and d.ro.rolling
    assert d.ro.history[-1].undo_of == 0 and d.ro.history[-1].result == "rolling"
    undo_step = [s for s in d.ro.steps if s.action == "undo"][-1]
    assert undo_step.reason.startswith("from version 1 to version 0's spec") and "skipped version 2" in undo_step.reason
    d.finish()
    assert d.results()[-1] == (3, "good")


def test_a_second_undo_goes_back_to_the_version_the_first_left_never_to_the_failure():
    d = Deployment("v1").deploy("v2").finish().deploy("v3").fail().finish().undo().finish()
    d.undo()
    assert d.running == "v2", d.results()  # not v3 (failed), and not v1 again (the current spec)
    d.finish().undo()
    assert d.running == "v1"


def test_undo_mid_rollout_goes_to_the_spec_in_service():
    d = Deployment("v1").deploy("v2").finish().deploy("v3")  # v3 rolling
    d.undo()
    assert d.running == "v2" and d.results()[-2:] == [(2, "replaced"), (3, "rolling")]


def test_a_version_never_finished_is_skipped_and_named():
    d = Deployment("v1").deploy("v2").deploy("v3").finish()  # v2 replaced mid-rollout by v3
    to, said = ro.undo_choice(d.ro)
    assert to.version == 0 and "skipped version 1 (replaced: version 2 came before its rollout finished)" in said


@pytest.mark.parametrize("history, refusal", [
    # nothing before the first spec
    (lambda d: d, "no version before version 0 was good"),
    # v1 -> v2 fails: v1 is current and nothing is older
    (lambda d: d.deploy("v2").fail().finish(), "no version before version 0 was good; skipped version 1 (rolled back: "
                                               "chat-1 is ERROR)"),
    # v1 good, v2 good, v1 again good, v2 again fails: v2's spec failed as version 3, v1 is the current spec
    (lambda d: d.deploy("v2").finish().deploy("v1").finish().deploy("v2").fail().finish(),
     "skipped version 3 (rolled back: chat-3 is ERROR); version 1 (its spec failed again as version 3); "
     "version 0 (the same spec as version 2)"),
    # the good spec fails while rolled back to: halted; it is no target either
    (lambda d: d.deploy("v2").fail().fail(), "skipped version 1 (rolled back: chat-1 is ERROR)"),
])
def test_undo_is_refused_with_the_reason_when_no_earlier_version_was_good(history, refusal):
    d = history(Deployment("v1"))
    to, said = ro.undo_choice(d.ro)
    assert to is None and refusal in said, said
    with pytest.raises(ValueError, match="nothing to undo to"):
        d.undo()


def test_halting_marks_the_good_version_failed():
    d = Deployment("v1").deploy("v2").finish().deploy("v3").fail().fail()  # v2 fails as rollback target
    assert d.results() == [(0, "deployed"), (1, "halted"), (2, "rolled back")]
    assert d.ro.history[1].reason == "chat-1 is ERROR while rolling back"
    assert ro.undo_choice(d.ro)[0].version == 0


def test_recreate_rolls_and_bakes_and_replicas_only_changes_keep_the_version():
    d = Deployment("v1").deploy("v2", rollout={"strategy": "recreate"})
    assert d.recreate and d.ro.rolling  # every replica stopped; the new ones start, then bake (issue 38)
    assert d.results() == [(0, "deployed"), (1, "rolling")]
    d.finish()
    assert d.results() == [(0, "deployed"), (1, "good")]
    d.deploy("v2", rollout={"strategy": "recreate"}, replicas=3)  # nothing that runs changed
    assert d.ro.version == 1 and d.ro.history[-1].spec.replicas == 3
    assert ro.undo_choice(d.ro)[0].version == 0


def test_the_history_is_bounded_and_keeps_the_current_version():
    d = Deployment("v1")
    for i in range(2, 16):  # 14 versions, each fails and is rolled back to v1
        d.deploy(f"v{i}").fail().finish()
    assert len(d.ro.history) == ro.KEEP_HISTORY and d.ro.history[0].version == 0 and d.running == "v1"
    assert [h.version for h in d.ro.history][1:] == list(range(6, 15))
    to, said = ro.undo_choice(d.ro)
    assert to is None and f"(the last {ro.KEEP_HISTORY} versions are kept)" in said


def test_big_specs_keep_fewer_versions():
    d = Deployment("v1")
    for i in range(2, 8):  # about 80 KiB of engine flags per spec
        d.deploy(f"v{i}", backend_parameters=[f"--x{j}={'y' * 4000}" for j in range(20)]).finish()
    assert [h.version for h in d.ro.history] == [4, 5, 6], d.results()  # 3 x 80 KiB fit in 256 KiB
    assert ro.undo_choice(d.ro)[0].version == 5


def test_the_history_survives_continue_as_new():
    d = Deployment("v1").deploy("v2").finish().deploy("v3").fail().finish()
    again = Deployment("v2", carried=d.ro.model_dump(), raw=d.raw)
    assert again.results() == d.results() and again.ro.history[0].raw() == spec("v1")
    assert ro.undo_choice(again.ro)[0].version == 0


def test_the_rollout_view_shows_the_versions_and_where_undo_goes():
    from gpuflow.cli.rollout import render

    d = Deployment("v1").deploy("v2").finish().deploy("v3").fail().finish()
    v = ro.view(d.ro, d.name, d.replicas, d.instances, d.stopping).model_dump(mode="json")  # as the query answers
    assert [(h["version"], h["result"], h["reason"]) for h in v["history"]] == [
        (0, "deployed", ""), (1, "good", ""), (2, "rolled back", "chat-2 is ERROR")]
    assert v["undo"]["to"] == 0 and v["can_undo"] and all("spec" not in h for h in v["history"])
    text = render(v)
    assert "v2  2025-01-01T00:00:00+00:00  rolled back: chat-2 is ERROR" in text
    assert "v1  2025-01-01T00:00:00+00:00  good  (current)" in text
    assert "undo would go to version 0's spec" in text
    d = Deployment("v1")
    v = ro.view(d.ro, d.name, d.replicas, d.instances, d.stopping).model_dump(mode="json")  # as the query answers
    assert not v["can_undo"] and "undo: nothing to undo to: no version before version 0 was good" in render(v)


@pytest.mark.parametrize("history, named", [
    ([{"version": 0, "result": "good", "spec": spec("v1")}] * 2, "history: versions [0, 0] are not increasing"),
    ([{"version": 5, "result": "good", "spec": spec("v1")}], "history: versions [5]"),  # beyond the latest
    ([{"version": 0, "result": "fine", "spec": spec("v1")}], "rollout: history.0.result"),
    ([{"version": 0, "result": "good", "spec": {"name": "x"}}], "rollout: history.0.spec"),
    ([{"version": 0, "result": "good", "spec": spec("v1"), "extra": 1}], "rollout: history.0.extra"),
    ([{"version": i, "result": "good", "spec": spec("v1")} for i in range(11)], "rollout: history"),
])
def test_a_bad_carried_history_fails_naming_it(history, named):
    with pytest.raises(ApplicationError) as e:
        ro.state_from({"latest": 20 if len(history) > 1 else 0, "history": history})
    assert named in e.value.message and e.value.non_retryable
