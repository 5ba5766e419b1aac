"""Running a backend's strategies in order: the first that yields any candidate wins."""

from __future__ import annotations

from typing import Callable

from scheduler.decision import Candidate


def first_nonempty(strategies: list[tuple[str, Callable[[list[str]], list[Candidate]]]],
                   msgs: list[str]) -> tuple[str | None, list[Candidate]]:
    for name, run in strategies:
        mine: list[str] = []
        found = run(mine)
        if found:
            return name, found
        msgs.extend(f"{name}: {m}" for m in mine)
    return None, []
