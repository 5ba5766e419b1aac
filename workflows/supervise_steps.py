"""Supervising a RUNNING replica in the instance workflow: one supervisor activity per process
(the server, and each helper of a placement across several workers) on its host's queue, until
one ends, the replica is asked to stop or give way, or its host's watch has news.

Liveness is kept per host, not per replica:
- A supervisor heartbeats within ``Timings.supervise_heartbeat_s`` (default 300 s): a fallback.
  Every RUNNING replica's heartbeat had been a write on the Temporal server every 8 s, the largest
  cost of a big cluster at rest.
- The host's watch (workflows/host.py, heartbeating within ``host_heartbeat_s``) tells the
  instances on it (``host_news``): ``lost`` (its agent stopped answering) ends the supervision as
  unreachable at once; ``restarted`` (a new agent run said hello: the old run's supervisors went
  with it) replaces the supervisors on that host, and the new agent adopts the processes.
- Stopping is explicit: ``stop_instance`` on every host of the placement, then the supervisors
  are cancelled without waiting (TRY_CANCEL). A cancelled supervisor only stops watching
  (``LaunchRequest.stop_on_cancel`` is False): it would hear the cancel only with its next
  heartbeat's answer."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from contracts.control import HostNews
    from contracts.drain import DrainAsk
    from contracts import agent as hp
    from workflows import common as c
    from workflows.instance_base import InstanceBase

Watched = list[tuple[str, hp.LaunchRequest]]  # (worker, the request of the process it runs)
Outcome = tuple[str, str, str]  # (stopped | exited | unreachable, why, host)


async def settle(handles: list) -> None:
    """Cancel the supervisors still running and collect every outcome (errors included)."""
    for h in handles:
        if not h.done():
            h.cancel()
    for h in handles:
        try:
            await h
        except (ActivityError, asyncio.CancelledError):
            pass


def outcome(sups: list, watched: Watched, ended: int | None, worker: str) -> Outcome:
    """How the supervision ended: no supervisor ended (stopped), one whose activity failed (its
    host is unreachable), or one whose process exited (with the agent's reason)."""
    if ended is None:
        return "stopped", "", worker
    host = watched[ended][0]
    try:
        ex = sups[ended].result()
    except ActivityError as e:
        return "unreachable", c.cause(e)[1], host
    return "exited", ex.reason, host


def lost_host(news: dict[str, HostNews], hosts: set[str]) -> HostNews | None:
    """The first (by name) of ``hosts`` that its watch reported lost."""
    return next((n for h, n in sorted(news.items()) if h in hosts and n.kind == "lost"), None)


class SuperviseSteps(InstanceBase):
    def _start_supervisor(self, worker: str, req: hp.LaunchRequest, sts: float):
        timeouts = self._host_timeouts(worker, sts)
        timeouts["heartbeat_timeout"] = c.secs(self.t.supervise_heartbeat_s)
        return workflow.start_activity(
            hp.SUPERVISE_INSTANCE, req, result_type=hp.ExitReport, **timeouts,
            start_to_close_timeout=timedelta(days=3650), retry_policy=RetryPolicy(maximum_attempts=2),
            cancellation_type=workflow.ActivityCancellationType.TRY_CANCEL)

    async def _supervise(self, watched: Watched, sts: float) -> Outcome:
        """Until a process ends, the replica is asked to stop or give way, or a host is lost."""
        s = self.s
        hosts = {w for w, _ in watched}
        for h in hosts:  # the launch (or adoption) on them just answered: what came before is old news
            s.news.pop(h, None)
        sups = [self._start_supervisor(w, r, sts) for w, r in watched]
        replaced: list = []

        while True:
            await workflow.wait_condition(lambda: any(x.done() for x in sups) or s.stop_requested
                                          or s.preempted is not None or any(h in s.news for h in hosts))
            if any(x.done() for x in sups) or s.stop_requested or s.preempted is not None \
                    or lost_host(s.news, hosts) is not None:
                break
            back = sorted(h for h in hosts if h in s.news)  # restarted: the new agent run supervises
            for h in back:
                s.news.pop(h)
            for i, (w, r) in enumerate(watched):
                if w in back:
                    sups[i].cancel()
                    replaced.append(sups[i])
                    sups[i] = self._start_supervisor(w, r, sts)
        ended = next((i for i, x in enumerate(sups) if x.done()), None)
        gone = lost_host(s.news, hosts) if ended is None and not s.stop_requested and s.preempted is None else None
        if ended is None and gone is None:  # asked to stop or to give way while it serves
            await self._drain(sups)  # out of the routing table, its requests finish first
            await self._stop_everywhere()
            s.processes_stopped = True
        elif len(watched) > 1:  # one part ended or its host is gone: the others end with it
            skip = {gone.host} if gone else set()
            if ended is not None and sups[ended].exception() is not None:
                skip.add(watched[ended][0])  # its supervisor failed: that host does not answer
            await self._stop_everywhere(skip)
        await settle(sups + replaced)
        if gone is not None:
            s.news.pop(gone.host, None)
            return "unreachable", gone.why, gone.host
        return outcome(sups, watched, ended, self.worker)

    async def _drain(self, sups: list) -> None:
        """DRAINING: gateways route RUNNING replicas only, so this one gets no new request; the
        drain activity waits until the gateways have none in flight on it, at most
        drain_timeout_s. The process ending meanwhile ends the wait."""
        limit = self.t.drain_timeout_s
        if limit <= 0:
            return
        await self._record("draining", f"finishing the requests in flight (at most {limit:g} s)")
        drain = workflow.start_activity(
            c.DRAIN_INSTANCE, DrainAsk(instance=self.inp.name, timeout_s=limit), result_type=int,
            start_to_close_timeout=c.secs(limit + 60),
            heartbeat_timeout=c.CONTROL_HEARTBEAT, retry_policy=RetryPolicy(maximum_attempts=3),
            summary=f"drain {self.inp.name}")
        await workflow.wait_condition(lambda: drain.done() or any(x.done() for x in sups))
        if not drain.done():
            drain.cancel()
        try:
            left = await drain
        except (ActivityError, asyncio.CancelledError):
            return
        if left:
            await self._record("draining", f"{left} request(s) still in flight after {limit:g} s; stopping")
