"""The corpus on disk: which scenarios it holds, which workflow types it must cover, and how a
history's file is named. Shared by the recorder (record.py) and the replay test, so neither can
drift from the other; nothing here starts a process."""

from __future__ import annotations

import os
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
HISTORIES = os.path.join(HERE, "histories")  # this build's, re-recorded after an intended change
RELEASES = os.path.join(HERE, "releases")  # releases/<version>/: a released build's, kept while its runs may be open
# one per scenario of issue 29: each brings up its own stack (scenarios.py)
SCENARIOS = ("deploy", "scale", "rollout", "preemption", "host_loss", "autoscale", "config")
WORKFLOW_TYPES = ("ModelDeploymentWorkflow", "ModelInstanceWorkflow", "HostWorkflow", "AutoscalerWorkflow",
                  "QueueSweepWorkflow", "ClusterWorkflow", "ClusterReadsWorkflow")
SEP = "__"  # neither a scenario nor a recorded workflow id holds it: the recorder refuses one that does


class Entry(NamedTuple):
    scenario: str
    workflow_id: str
    path: str


def file_name(scenario: str, workflow_id: str) -> str:
    """``rollout__deployment__chat.json`` for workflow ``deployment/chat`` of scenario ``rollout``."""
    if SEP in scenario or SEP in workflow_id:
        raise ValueError(f"{scenario!r} / {workflow_id!r}: {SEP!r} is the file name's separator")
    return f"{scenario}{SEP}{workflow_id.replace('/', SEP)}.json"


def release_folders() -> list[str]:
    """The frozen corpora of past releases (none before the first release)."""
    if not os.path.isdir(RELEASES):
        return []
    return [os.path.join(RELEASES, d) for d in sorted(os.listdir(RELEASES)) if os.path.isdir(os.path.join(RELEASES, d))]


def entries(folder: str = HISTORIES) -> list[Entry]:
    """Every history in ``folder``, sorted by file name, with its scenario and workflow id."""
    out = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            scenario, _, rest = name.removesuffix(".json").partition(SEP)
            out.append(Entry(scenario, rest.replace(SEP, "/"), os.path.join(folder, name)))
    return out
