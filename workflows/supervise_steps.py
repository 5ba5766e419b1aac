"""Supervising a RUNNING replica in the instance workflow: one supervisor activity per process
(the server, and each helper of a placement across several workers) on its host's queue, until
one ends, the replica is asked to stop or give way, or (generation 2) its host's watch has news.

Generation 2 (workflows/common.py: generation) keeps liveness per host, not per replica:
- A supervisor heartbeats within ``Timings.supervise_heartbeat_s`` (default 300 s): a fallback.
  Every RUNNING replica's heartbeat had been a write on the Temporal server every 8 s, the largest
  cost of a big cluster at rest.
- The host's watch (workflows/host.py, heartbeating within ``host_heartbeat_s``) tells the
  instances on it (``host_news``): ``lost`` (its agent stopped answering) ends the supervision as
  unreachable at once; ``restarted`` (a new agent run said hello: the old run's supervisors went
  with it) replaces the supervisors on that host, and the new agent adopts the processes.
- Stopping is explicit: ``stop_instance`` on every host of the placement, then the supervisors
  are cancelled without waiting (TRY_CANCEL). A cancelled supervisor only stops watching
  (``LaunchRequest.stop_on_cancel``); before, a supervisor stopped its process when cancelled, and
  it heard the cancel only with its next heartbeat's answer.
Runs of generation 0 and 1 supervise as they always did (``supervise_v1``)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from contracts.control import HostNews
    from contracts import agent as hp
    from workflows import common as c

Watched = list[tuple[str, hp.LaunchRequest]]  # (worker, the request of the process it runs)


def _start(wf, worker: str, req: hp.LaunchRequest, sts: float, v2: bool):
    timeouts = wf._host_timeouts(worker, sts)
    if v2:
        timeouts["heartbeat_timeout"] = c.secs(wf.t.supervise_heartbeat_s)
    return workflow.start_activity(
        hp.SUPERVISE_INSTANCE, req, result_type=hp.ExitReport, **timeouts,
        start_to_close_timeout=timedelta(days=3650), retry_policy=RetryPolicy(maximum_attempts=2),
        cancellation_type=(workflow.ActivityCancellationType.TRY_CANCEL if v2
                           else workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED))


async def _settle(handles: list) -> None:
    """Cancel the supervisors still running and collect every outcome (errors included)."""
    for s in handles:
        if not s.done():
            s.cancel()
    for s in handles:
        try:
            await s
        except (ActivityError, asyncio.CancelledError):
            pass


def _outcome(sups: list, watched: Watched, ended: int | None, worker: str) -> tuple[str, str, str]:
    if ended is None:
        return "stopped", "", worker
    host = watched[ended][0]
    try:
        ex = sups[ended].result()
    except ActivityError as e:
        return "unreachable", c.cause(e)[1], host
    return "exited", ex.reason, host


async def supervise_v1(wf, watched: Watched, sts: float) -> tuple[str, str, str]:
    """Generations 0 and 1: a cancelled supervisor stops its process (one part ending ends them all)."""
    sups = [_start(wf, w, r, sts, v2=False) for w, r in watched]
    await workflow.wait_condition(lambda: any(s.done() for s in sups) or wf.stop_requested
                                  or wf.preempted is not None)
    ended = next((i for i, s in enumerate(sups) if s.done()), None)
    if ended is None and c.patched(wf.inp, "drain-before-stop"):  # asked to stop while it serves:
        await wf._drain(sups)  # out of the routing table, its requests finish first
    await _settle(sups)
    return _outcome(sups, watched, ended, wf.worker)


async def supervise(wf, watched: Watched, sts: float) -> tuple[str, str, str]:
    """Generation 2. Returns (outcome, why, host) as _run_on_host does."""
    hosts = {w for w, _ in watched}
    for h in hosts:  # the launch (or adoption) on them just answered: what came before is old news
        wf.news.pop(h, None)
    sups = [_start(wf, w, r, sts, v2=True) for w, r in watched]
    replaced: list = []

    def lost() -> HostNews | None:
        return next((n for h, n in sorted(wf.news.items()) if h in hosts and n.kind == "lost"), None)

    while True:
        await workflow.wait_condition(lambda: any(s.done() for s in sups) or wf.stop_requested
                                      or wf.preempted is not None or any(h in wf.news for h in hosts))
        if any(s.done() for s in sups) or wf.stop_requested or wf.preempted is not None or lost() is not None:
            break
        back = sorted(h for h in hosts if h in wf.news)  # restarted: the new agent run supervises
        for h in back:
            wf.news.pop(h)
        for i, (w, r) in enumerate(watched):
            if w in back:
                sups[i].cancel()
                replaced.append(sups[i])
                sups[i] = _start(wf, w, r, sts, v2=True)
    ended = next((i for i, s in enumerate(sups) if s.done()), None)
    gone = lost() if ended is None and not wf.stop_requested and wf.preempted is None else None
    if ended is None and gone is None:  # asked to stop or to give way while it serves
        await wf._drain(sups)  # out of the routing table, its requests finish first
        await wf._stop_everywhere()
        wf.processes_stopped = True
    elif len(watched) > 1:  # one part ended or its host is gone: the others end with it
        skip = {gone.host} if gone else set()
        if ended is not None and sups[ended].exception() is not None:
            skip.add(watched[ended][0])  # its supervisor failed: that host does not answer
        await wf._stop_everywhere(skip)
    await _settle(sups + replaced)
    if gone is not None:
        wf.news.pop(gone.host, None)
        return "unreachable", gone.why, gone.host
    return _outcome(sups, watched, ended, wf.worker)
