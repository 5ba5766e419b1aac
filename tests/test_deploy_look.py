"""deploy's first look (gpuflow/deploy_look.py, issue 37): when it has nothing to say from
visibility alone, and when placing has stalled so that the PENDING replicas are asked why."""

import pytest

from gpuflow.deploy_look import settled, stalled


@pytest.mark.parametrize("seen, wanted, out", [
    ({}, 0, True),                                            # replicas 0: nothing to wait for
    ({"m-0": "running", "m-1": "starting"}, 2, True),         # every wanted replica placed or starting
    ({"m-0": "running"}, 2, False),                           # one not started yet
    ({"m-0": "running", "m-1": "pending"}, 2, False),         # one PENDING: its reason may matter
    ({"m-0": "stopping", "m-1": "running", "m-2": "running"}, 2, True),  # a scale-down's leaver
])
def test_settled(seen, wanted, out):
    assert settled(seen, wanted) is out


@pytest.mark.parametrize("counts, out", [
    ([50], False),              # one look: nothing to compare
    ([50, 50], False),          # two looks, one interval: not yet (STALL_LOOKS 2)
    ([50, 50, 50], True),       # no fall over two intervals: stalled
    ([50, 40, 40], False),      # fell 50 -> 40 within the last two: placing goes on
    ([50, 48, 45, 45, 45], True),  # fell, then stopped: min(45, 45) >= 45
    ([3, 2, 1, 1, 0], False),   # still falling
])
def test_stalled(counts, out):
    assert stalled(counts) is out
