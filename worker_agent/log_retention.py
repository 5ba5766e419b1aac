"""How many instance logs an agent keeps on its host (``gpuflow agent --keep-logs``), and the pruning
of older ones. Apart from worker_agent/log_reader.py (the reading workflow, which re-exports these)
so that the CLI's parser reads the flag's default without Temporal's workflow module and the
agent's contracts: every cluster command builds ``gpuflow agent``'s flags (issue 37: a ``gpuflow
deploy`` process's start). Imports only the standard library."""

from __future__ import annotations

import os
import re

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # an instance's name rule (the model spec's: scheduler/spec.py)
KEEP_LOGS = 200  # the agent's --keep-logs default: logs of instances no longer running here


def prune_logs(log_dir: str, keep: int, running: set[str]) -> list[str]:
    """Keep the logs of the ``keep`` instances that last wrote one here and run here no more;
    delete the older ones (an instance's helper logs, instance@part, go with it). An instance
    running here (``running``: instance names) keeps its log whatever its age. One file per
    instance name: a restart, or a later replica of the same name, appends to it. The deleted
    file names are returned."""
    last: dict[str, float] = {}
    files: dict[str, list[str]] = {}
    for fn in os.listdir(log_dir):
        inst = fn[:-len(".log")].split("@", 1)[0] if fn.endswith(".log") else ""
        if not NAME.fullmatch(inst) or inst in running:
            continue
        try:
            at = os.stat(os.path.join(log_dir, fn)).st_mtime
        except OSError:
            continue
        last[inst] = max(at, last.get(inst, 0.0))
        files.setdefault(inst, []).append(fn)
    gone = sorted(last, key=lambda i: (-last[i], i))[max(keep, 0):]
    dropped = []
    for fn in (f for i in gone for f in files[i]):
        try:
            os.unlink(os.path.join(log_dir, fn))
            dropped.append(fn)
        except OSError:
            pass
    return sorted(dropped)


def prune_table_logs(table, keep: int) -> list[str]:
    """``prune_logs`` over a process table's log folder, its running processes kept."""
    return prune_logs(table.log_dir, keep, {r.instance.split("@", 1)[0] for r in table.records()})
