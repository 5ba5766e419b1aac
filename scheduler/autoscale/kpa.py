"""The ``concurrency`` rule: Knative KPA's arithmetic. Where the other rules compare a signal with a
threshold and vote a step (rules.py), this one computes the replicas the load needs and votes the
difference, so the policy moves there in one step:

    desired = ceil(observed / target)

``observed`` is the requests in the system (served, waiting in an engine, queued in a gateway),
averaged over a window's samples (evidence.py ``concurrency``); ``target`` is what one replica
should hold. Two windows, as KPA has:

1. **Panic** (``panic_window_s``, at least one interval): when its desired count is at least
   ``panic_threshold`` (2.0) times the RUNNING replicas, it is the vote: a burst is met at once,
   with every replica it needs (KPA's panic mode: desiredPanic / ready >= 200%).
2. **Stable** (``stable_window_s``, 60 s): otherwise the stable window's desired count is the vote,
   up or down. Down needs the window complete and the policy's stable window for scale-in
   (``scale_down_stabilization_s``); the panic window never votes down.

The windows hold samples taken after the last step only (a step is never taken twice on the same
samples), and each needs ``min_samples`` requests, as every rule does; a window with no traffic at
all votes down (idle). The step rates and bounds are the policy's (policy.py)."""

from __future__ import annotations

import math

from scheduler.autoscale.config import Concurrency
from scheduler.autoscale.evidence import Evidence, evidence
from scheduler.autoscale.rules import Vote, Windows
from scheduler.autoscale.signals import Sample

EPS = 1e-9  # 12.000000001 / 4 is 3 replicas, not 4


def needed(observed: float, target: float) -> int:
    """ceil(observed / target): the replicas ``observed`` requests in the system need."""
    return max(0, math.ceil(observed / target - EPS))


def _show(ev: Evidence, r: Concurrency) -> str:
    return (f"{ev.concurrency:.1f} in the system / {r.target:g} per replica = {needed(ev.concurrency, r.target)} "
            f"over {ev.span:g} s ({ev.requests:g} requests)")


def concurrency(r: Concurrency, history: list[Sample], now: float, w: Windows) -> Vote:
    running = w.running
    panic = evidence(history, now, w.panic(), w.last_step_at)
    if panic.covered and panic.requests >= r.min_samples:
        want = needed(panic.concurrency, r.target)
        if want > running and want >= w.panic_threshold * max(running, 1):
            return Vote(r.kind, +1, want - running, f"burst: {_show(panic, r)} >= {w.panic_threshold:g} x "
                                                    f"{running} running")
    stable = evidence(history, now, w.stable(), w.last_step_at)
    if not stable.covered:
        after = "" if w.last_step_at is None else " after the last step"
        return Vote(r.kind, 0, 0, f"signals{after} cover {stable.covers_s:.0f} of {stable.span:g} s")
    if stable.idle and stable.complete:
        return Vote(r.kind, -1, running, f"no traffic over {stable.span:g} s")
    if stable.requests < r.min_samples and not (stable.quiet and stable.complete):
        return Vote(r.kind, 0, 0, f"{stable.requests:g} of {r.min_samples} requests over {stable.span:g} s: "
                                  f"too few to judge")
    want = max(needed(stable.concurrency, r.target), 1 if stable.requests > 0 else 0)  # traffic keeps one
    if want > running and stable.requests >= r.min_samples:
        return Vote(r.kind, +1, want - running, _show(stable, r))
    if want < running and stable.complete:
        return Vote(r.kind, -1, running - want, _show(stable, r))
    return Vote(r.kind, 0, 0, f"{_show(stable, r)}: {running} running")
