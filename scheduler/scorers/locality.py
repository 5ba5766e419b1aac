"""Model-file locality: the share of a candidate's workers that already hold the model's files
(READY in the snapshot's model_files), the draft model's counting half as much:
  score = (main_ratio + dw*draft_ratio) / (1 + dw) * 100, dw = 0.5 if any worker holds the draft."""

from __future__ import annotations

from scheduler.cluster import FileState, ModelFile


def ready_on(files: list[ModelFile], source_key: str | None) -> set[str]:
    if not source_key:
        return set()
    return {f.worker for f in files if f.source == source_key and f.state == FileState.READY}


def score(workers: list[str], ready_main: set[str], ready_draft: set[str]) -> float:
    ws = set(workers)
    main = len(ws & ready_main) / len(ws) if ready_main else 0.0
    draft = len(ws & ready_draft) / len(ws) if ready_draft else 0.0
    if not main and not draft:
        return 0.0
    dw = 0.5 if ready_draft else 0.0
    return (main + dw * draft) / (1 + dw) * 100
