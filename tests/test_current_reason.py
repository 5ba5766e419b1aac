"""The reason a waiting replica shows (activities/wake_queue.current): the queue's verdict, after
what preempted it, if anything did; the preemption part stays until the replica is placed again."""

from __future__ import annotations

import pytest

from activities.wake_queue import current

QUOTA = "quota: tenant dev uses 1 of its 1 GPUs"
NOFIT = "unschedulable: The largest allocatable GPU has 4.0 GiB"
BY = "preempted by prod/prod-m-1 to reclaim prod's guarantee"


@pytest.mark.parametrize("old, verdict, shown", [
    ("unschedulable: The largest allocatable GPU has 4.0 GiB", QUOTA, QUOTA),  # the probe's stale reason: replaced
    (QUOTA, NOFIT, NOFIT),  # capacity changed: the verdict follows
    (BY, NOFIT, f"{BY}; now: {NOFIT}"),  # preempted: kept, with the current verdict after it
    (f"{BY}; now: {NOFIT}", QUOTA, f"{BY}; now: {QUOTA}"),  # the verdict moves on, the preemption stays once
    ("", QUOTA, QUOTA),
])
def test_the_reason_a_waiting_replica_shows(old, verdict, shown):
    assert current(old, verdict) == shown
