"""The ``concurrency`` and ``rps`` rules: Knative KPA's arithmetic. Where the other rules compare a
signal with a threshold and vote a step (rules.py), these compute the replicas the load needs and
vote the difference, so the policy moves there in one step:

    desired = ceil(observed / target)

``observed`` is, for ``concurrency``, the requests in the system (served, waiting in an engine,
queued in a gateway) averaged over a window's samples (evidence.py ``concurrency``); for ``rps``,
the requests that arrived per second over the window (``arrivals_per_s``: finished plus what the
system gained). ``target`` is what one replica should hold or serve. Two windows, as KPA has:

1. **Panic** (``panic_window_s``, at least one interval): when its desired count is at least
   ``panic_threshold`` (2.0) times the RUNNING replicas, it is the vote: a burst is met at once,
   with every replica it needs (KPA's panic mode: desiredPanic / ready >= 200%).
2. **Stable** (``stable_window_s``, 60 s): otherwise the stable window's desired count is the vote,
   up or down. Down needs the window complete and the policy's stable window for scale-in
   (``scale_down_stabilization_s``); the panic window never votes down. While there is traffic,
   at least one replica is wanted.
3. **A dead band** (``tolerance``, 0.1, Kubernetes HPA's): up only when the observed value is over
   the running replicas' share by more than 10%; down only to the count that keeps each replica
   10% under its target. A load that hovers at a count's edge moves nothing.

The windows hold samples taken after the last step only (a step is never taken twice on the same
samples), and each needs ``min_samples`` requests, as every rule does; a window with no traffic at
all votes down (idle). The step rates and bounds are the policy's (policy.py).

``concurrency`` counts a backlog as demand: right for a closed load (callers who wait for their
answer), an overshoot for an open one whose queue grew while replicas started (bench/
bench_autoscaler.py shows both); ``rps`` counts arrivals only."""

from __future__ import annotations

import math

from scheduler.autoscale.config import Concurrency, Rps
from scheduler.autoscale.evidence import Evidence, arrivals_per_s, evidence
from scheduler.autoscale.rules import Vote, Windows
from scheduler.autoscale.signals import Sample

EPS = 1e-9  # 12.000000001 / 4 is 3 replicas, not 4


def needed(observed: float, target: float) -> int:
    """ceil(observed / target): the replicas ``observed`` needs at ``target`` each."""
    return max(0, math.ceil(observed / target - EPS))


def _observed(r: Concurrency | Rps, history: list[Sample], ev: Evidence) -> tuple[float, str]:
    if r.kind == "rps":
        rate = arrivals_per_s(history, ev) or 0.0
        return rate, f"{rate:.2f} requests/s arriving / {r.target:g} per replica"
    return ev.concurrency, f"{ev.concurrency:.1f} in the system / {r.target:g} per replica"


def _want(r, history: list[Sample], ev: Evidence, running: int) -> tuple[int, str]:
    """The count the window asks for, with the dead band: above the running replicas only when the
    observed value is over their share by more than ``tolerance``; below them only to the count that
    keeps each replica ``tolerance`` under its target (ceil(observed / (target x (1 - tolerance))))."""
    seen, what = _observed(r, history, ev)
    want = max(needed(seen, r.target), 1 if ev.requests > 0 else 0)  # traffic keeps one
    band = ""
    if want > running and seen <= running * r.target * (1 + r.tolerance):
        want, band = running, f", within {r.tolerance:g} of {running} running"
    elif want < running:
        want = max(needed(seen, r.target * (1 - r.tolerance)), want)
        band = f" (at {1 - r.tolerance:g} of the target: {want})" if r.tolerance else ""
    return want, f"{what} = {needed(seen, r.target)}{band} over {ev.span:g} s ({ev.requests:g} requests)"


def kpa(r: Concurrency | Rps, history: list[Sample], now: float, w: Windows) -> Vote:
    running = w.running
    panic = evidence(history, now, w.panic(), w.last_step_at)
    if panic.covered and panic.requests >= r.min_samples:
        want, show = _want(r, history, panic, running)
        if want > running and want >= w.panic_threshold * max(running, 1):
            return Vote(r.kind, +1, want - running, f"burst: {show} >= {w.panic_threshold:g} x {running} running")
    stable = evidence(history, now, w.stable(), w.last_step_at)
    if not stable.covered:
        after = "" if w.last_step_at is None else " after the last step"
        return Vote(r.kind, 0, 0, f"signals{after} cover {stable.covers_s:.0f} of {stable.span:g} s")
    if stable.idle and stable.complete:
        return Vote(r.kind, -1, running, f"no traffic over {stable.span:g} s")
    if stable.requests < r.min_samples and not (stable.quiet and stable.complete):
        return Vote(r.kind, 0, 0, f"{stable.requests:g} of {r.min_samples} requests over {stable.span:g} s: "
                                  f"too few to judge")
    want, show = _want(r, history, stable, running)
    if want > running and stable.requests >= r.min_samples:
        return Vote(r.kind, +1, want - running, show)
    if want < running and stable.complete:
        return Vote(r.kind, -1, running - want, show)
    return Vote(r.kind, 0, 0, f"{show}: {running} running")
