"""A failed start's reason is what that start wrote (worker_agent/processes.py ``tail``): the log
keeps every start's output, and a replica that fails again and again must not show the earlier
starts' lines in its reason (the newcomer's walk of issue 26 saw three ports in one reason)."""

from __future__ import annotations

import sys
import time

import pytest

from worker_agent.processes import ProcessTable, latest_run

M = "--- gpuflow: starting engine"


@pytest.mark.parametrize("text, want", [
    (f"{M}\nport 1\nfail\n", ["port 1", "fail"]),                       # one start: its lines
    (f"{M}\nport 1\nfail\n{M}\nport 2\nfail\n", ["port 2", "fail"]),    # two: the second's only
    (f"{M}\nport 1\nfail\n{M}\n", []),                                   # the latest wrote nothing yet
    ("...the end of a long first start\nfail\n", ["...the end of a long first start", "fail"]),  # marker cut off
    (f"{M}\n\nfail\n\n", ["fail"]),                                      # blank lines left out
])
def test_latest_run(text, want):
    assert latest_run(text) == want


def test_a_process_that_fails_twice_gives_the_second_starts_reason(tmp_path):
    # two real starts of a process that prints its attempt and exits 3
    table = ProcessTable(str(tmp_path))
    for n in (1, 2):
        rec = table.start("bad-0", [sys.executable, "-c", f"print('attempt {n}: refusing to start'); raise SystemExit(3)"],
                          {}, None)
        deadline = time.monotonic() + 30
        while table.returncode(rec.pid) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert table.returncode(rec.pid) == 3
    assert table.tail("bad-0") == "attempt 2: refusing to start"
    out = [ln for ln in open(table.log_path("bad-0")).read().splitlines() if not ln.startswith("--- gpuflow")]
    assert out == ["attempt 1: refusing to start", "attempt 2: refusing to start"]  # the log keeps both
