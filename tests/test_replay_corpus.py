"""The replay corpus (tests/replay/): every committed history, recorded from real runs of this
build, replays against today's workflow code under the full sandbox, with gpuflow's data
converter. A change that breaks a workflow's determinism (commands in another order, an activity
added or dropped in a path a recorded run took) fails here, naming every broken history at once.
After an intended change, re-record (tests/replay/README.md)."""

from __future__ import annotations

import os
from collections import Counter

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from gpuflow.converter import DATA_CONVERTER
from gpuflow.server import WORKFLOWS
from tests.replay.corpus import HISTORIES, SCENARIOS, WORKFLOW_TYPES, entries, file_name, release_folders
from worker_agent.log_reader import HostLogsWorkflow

CLASSES = [*WORKFLOWS, HostLogsWorkflow]  # the control plane's and the agent's (host-logs/<worker>)


class Corpus(list):
    """(scenario, history) pairs, shown by their count in a failure's report, not event by event."""

    def __repr__(self) -> str:
        return f"<{len(self)} recorded histories>"


def load(folder: str = HISTORIES) -> Corpus:
    """(scenario, history) for every file of the corpus in ``folder``."""
    out = Corpus()
    for e in entries(folder):
        with open(e.path) as f:
            out.append((e.scenario, WorkflowHistory.from_json(e.workflow_id, f.read())))
    return out


def type_of(h: WorkflowHistory) -> str:
    return h.events[0].workflow_execution_started_event_attributes.workflow_type.name


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    got = load()
    assert got, f"no histories in {HISTORIES}: record them (tests/replay/README.md)"
    return got


async def test_every_recorded_history_replays_under_the_sandbox(corpus):
    """This build's histories and, after the first release, each release's (README.md: versioning)."""
    corpus = Corpus(corpus + [(f"release {os.path.basename(folder)}, {scenario}", h)
                              for folder in release_folders() for scenario, h in load(folder)])

    async def each():
        for _, h in corpus:
            yield h

    replayer = Replayer(workflows=CLASSES, data_converter=DATA_CONVERTER, workflow_runner=SandboxedWorkflowRunner())
    results = await replayer.replay_workflows(each(), raise_on_replay_failure=False)
    where = {h.run_id: f"{scenario}: {h.workflow_id}" for scenario, h in corpus}  # run ids are unique
    broken = {where.get(run, run): f"{type(e).__name__}: {e}" for run, e in results.replay_failures.items()}
    assert broken == {}, "histories that no longer replay:\n" + "\n".join(f"{k}\n    {v}" for k, v in sorted(broken.items()))


def test_the_corpus_covers_every_scenario_and_workflow_type(corpus):
    assert sorted({s for s, _ in corpus}) == sorted(SCENARIOS)
    assert set(WORKFLOW_TYPES) <= {type_of(h) for _, h in corpus}
    assert {type_of(h) for _, h in corpus} <= {getattr(c, "__temporal_workflow_definition").name for c in CLASSES}
    per = Counter((s, type_of(h)) for s, h in corpus)
    for s in SCENARIOS:  # each scenario drove a deployment and its replicas on hosts
        for t in ("ModelDeploymentWorkflow", "ModelInstanceWorkflow", "HostWorkflow"):
            assert per[(s, t)] >= 1, (s, t)
    assert per[("autoscale", "AutoscalerWorkflow")] == 1
    assert per[("config", "ClusterWorkflow")] >= 1  # its updates: tenants, a key made and revoked, reads
    assert per[("preemption", "ModelDeploymentWorkflow")] == 2  # the preemptor's tenant and the victim's
    assert per[("host_loss", "HostWorkflow")] == 2


def test_file_names_give_back_the_scenario_and_workflow_id(tmp_path):
    for scenario, wid in [("rollout", "deployment/chat"), ("deploy", "queue-sweep"), ("scale", "instance/chat-12")]:
        (tmp_path / file_name(scenario, wid)).write_text("{}")
    got = {(e.scenario, e.workflow_id) for e in entries(str(tmp_path))}
    assert got == {("rollout", "deployment/chat"), ("deploy", "queue-sweep"), ("scale", "instance/chat-12")}
    with pytest.raises(ValueError):
        file_name("a__b", "deployment/x")
    assert os.path.isdir(HISTORIES)
