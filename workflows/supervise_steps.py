"""Supervising a RUNNING replica in the instance workflow: its host's agent supervises each of its
processes (the server, and each helper of a placement across several workers) itself
(worker_agent/supervision.py), and the workflow waits, with no activity, until one ends, the replica
is asked to stop or give way, or a host's watch has other news.

What ends it arrives as host news (``host_news``, from the control plane's host activities), one
watch per host speaking for all of its processes (issue 37: a supervisor activity per process was
about a sixth of what a replica cost the cluster to start):
- ``exited``: the host's signed watch report said the process (its key, and the pid this run
  launched) ended, with the agent's reason: exited, or failed its health check and was stopped;
- ``lost``: its agent stopped answering (the watch's heartbeat timed out): unreachable at once;
- ``restarted``: a new agent run said hello. It adopted the processes from their pid files; each
  instance asks it to supervise them again (``supervise_instance``, which answers at once), or
  hears that one is not running any more (it ended while no agent watched).
- Stopping is explicit: ``stop_instance`` on every host of the placement (the agent stops
  supervising a process it is asked to stop: that end is no news)."""

from __future__ import annotations

import asyncio

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


def lost_host(news: dict[str, HostNews], hosts: set[str]) -> HostNews | None:
    """The first (by name) of ``hosts`` that its watch reported lost."""
    return next((n for h, n in sorted(news.items()) if h in hosts and n.kind == "lost"), None)


class SuperviseSteps(InstanceBase):
    def _ended(self, watched: Watched) -> HostNews | None:
        """The first watched process whose host said it ended: its key, on that host, with the pid
        this run launched (an end of an earlier process of the same key is old news)."""
        s = self.s
        for w, r in watched:
            n = s.exits.get(r.key)
            if n is not None and n.host == w and n.pid == s.pids.get(r.key):
                return n
        return None

    async def _supervise(self, watched: Watched, sts: float) -> Outcome:
        """Until a process ends, the replica is asked to stop or give way, or a host is lost."""
        s = self.s
        hosts = {w for w, _ in watched}  # their news from before this launch was dropped as it began (host_steps.py)
        s.drop_old_exits()
        ended: Outcome | None = None
        while ended is None:
            await workflow.wait_condition(lambda: self._ended(watched) is not None or s.stop_requested
                                          or s.preempted is not None or any(h in s.news for h in hosts))
            if (n := self._ended(watched)) is not None:
                ended = ("exited", n.why, n.host)
            elif s.stop_requested or s.preempted is not None:
                break
            elif (gone := lost_host(s.news, hosts)) is not None:
                s.news.pop(gone.host, None)
                ended = ("unreachable", gone.why, gone.host)
            else:  # restarted: the new agent run supervises what it adopted, once asked
                back = sorted(h for h in hosts if h in s.news)
                for h in back:
                    s.news.pop(h)
                ended = await self._supervise_again([(w, r) for w, r in watched if w in back], sts)
        if ended is None:  # asked to stop or to give way while it serves
            await self._drain(watched)  # out of the routing table, its requests finish first
            await self._stop_everywhere()
            s.processes_stopped = True
        elif len(watched) > 1:  # one part ended or its host is gone: the others end with it
            await self._stop_everywhere({ended[2]} if ended[0] == "unreachable" else set())
        return ended or ("stopped", "", self.worker)

    async def _supervise_again(self, watched: Watched, sts: float) -> Outcome | None:
        """Ask each host's new agent run to supervise its process; the first that is not running
        there (exited) or whose host does not answer (unreachable); None when all are supervised."""
        async def one(worker: str, req: hp.LaunchRequest) -> Outcome | None:
            timeouts = self._host_timeouts(worker, sts)
            try:
                ex = await workflow.execute_activity(
                    hp.SUPERVISE_INSTANCE, req, result_type=hp.ExitReport | None, **timeouts,
                    start_to_close_timeout=c.secs(120), retry_policy=RetryPolicy(maximum_attempts=2),
                    summary=f"supervise {req.key} on {worker}")
            except ActivityError as e:
                return "unreachable", c.cause(e)[1], worker
            return None if ex is None else ("exited", ex.reason, worker)

        done = await asyncio.gather(*(one(w, r) for w, r in watched))
        return next((d for d in done if d is not None), None)

    async def _drain(self, watched: Watched) -> None:
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
        await workflow.wait_condition(lambda: drain.done() or self._ended(watched) is not None)
        if not drain.done():
            drain.cancel()
        try:
            left = await drain
        except (ActivityError, asyncio.CancelledError):
            return
        if left:
            await self._record("draining", f"{left} request(s) still in flight after {limit:g} s; stopping")
