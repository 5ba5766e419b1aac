"""An agent keeps the logs of the last N instances that ended on its host (``--keep-logs``), on
real files: the newest by modification time stay, a running instance's log stays whatever its age,
and an instance's helper logs (instance@part) go with it. ``gpuflow logs`` of an ended replica
reads what is kept (tests/test_deploy_wait_live.py)."""

from __future__ import annotations

import os

import pytest

from gpuflow.instance_logs import host_of_queue, tail_lines
from worker_agent.log_reader import prune_logs


def logs(tmp_path, ages: dict[str, int]) -> str:
    """One file per name, modified ``age`` seconds before t=1,000,000."""
    for fn, age in ages.items():
        p = tmp_path / fn
        p.write_text(f"{fn}\n")
        os.utime(p, (1_000_000 - age, 1_000_000 - age))
    return str(tmp_path)


FILES = {"a-0.log": 50, "a-1.log": 40, "a-1@rpc0.log": 45, "b-0.log": 30, "c-9.log": 10, "old-0.log": 500,
         "notes.txt": 900}


@pytest.mark.parametrize("keep, running, dropped", [
    # ended, newest first: c-9 (10 s), b-0 (30), a-1 (40; its helper 45), a-0 (50), old-0 (500)
    (3, set(), ["a-0.log", "old-0.log"]),  # keeps c-9, b-0, a-1 (+ a-1@rpc0)
    (1, set(), ["a-0.log", "a-1.log", "a-1@rpc0.log", "b-0.log", "old-0.log"]),  # the helper goes with a-1
    (1, {"old-0"}, ["a-0.log", "a-1.log", "a-1@rpc0.log", "b-0.log"]),  # running: kept, and not counted
    (0, {"a-1"}, ["a-0.log", "b-0.log", "c-9.log", "old-0.log"]),  # 0: only running instances' logs stay
    (10, set(), []),  # fewer than 10 ended: all stay
])
def test_the_last_n_ended_instances_keep_their_logs(tmp_path, keep, running, dropped):
    d = logs(tmp_path, FILES)
    assert prune_logs(d, keep, running) == dropped
    assert sorted(os.listdir(d)) == sorted(set(FILES) - set(dropped))  # notes.txt: not a log, left alone


@pytest.mark.parametrize("queue, host", [
    ("gpuflow-host-gpu-a", "gpu-a"), ("gpuflow-host-", None), ("gpuflow-control", None)])
def test_the_host_of_a_launch_queue(queue, host):
    assert host_of_queue(queue) == host


def test_the_tail_leaves_gpuflows_markers_out():
    text = "--- gpuflow: starting python3 x\nloading\n\nengine: refusing to start\n"
    assert tail_lines(text) == ["loading", "engine: refusing to start"]
    assert tail_lines("\n".join(map(str, range(9))), 3) == ["6", "7", "8"]
