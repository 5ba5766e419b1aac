"""The agent supervises every process it launched or adopted, itself: one task per process in
the agent, no Temporal activity per replica (issue 37: a supervisor activity was about a sixth of
what a replica cost the cluster to start).

A process ends (it exited, or failed its health check ``liveness_failures`` times in a row and was
stopped here): its end is kept (contracts/process_end.py) and the host watch returns at once with
it in its report; the control plane tells the instance, acknowledges it in its next watch, and the
end is forgotten here. A process stopped because its instance asked (stop_instance) is released
first: its end is no news. The agent's own end (SIGTERM, a crash) ends the supervision, never the
processes: the next agent run adopts them once each instance asks it to supervise again."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

from contracts import agent as p
from contracts.process_end import MAX_ENDED, REASON_MAX, EndRef, ProcessEnd
from worker_agent.processes import ProcessTable, Record

Probe = Callable[[p.LaunchRequest, Record], Awaitable[bool]]  # does the server answer its health check
Stop = Callable[[str], Awaitable[bool]]
Ended = Callable[[p.LaunchRequest, ProcessEnd], None]  # metrics, a learned OOM

log = logging.getLogger("gpuflow.agent")


class Supervision:
    def __init__(self, table: ProcessTable, probe: Probe, stop: Stop, on_end: Ended, name: str = ""):
        self.table, self.probe, self.stop, self.on_end, self.name = table, probe, stop, on_end, name
        self.tasks: dict[str, tuple[int, asyncio.Task]] = {}  # process key -> (pid, its supervising task)
        self.ended: dict[str, ProcessEnd] = {}  # process key -> its end, until the control plane acknowledges it
        self.news = asyncio.Event()  # set when an end is kept: the watch returns

    def supervise(self, req: p.LaunchRequest, rec: Record) -> None:
        """Supervise ``rec`` (the process of ``req.key``) from now on; the same process again is a no-op."""
        cur = self.tasks.get(req.key)
        if cur is not None and cur[0] == rec.pid and not cur[1].done():
            return
        if cur is not None:
            cur[1].cancel()
        self.tasks[req.key] = (rec.pid, asyncio.create_task(self._run(req, rec), name=f"supervise {req.key}"))

    def supervising(self, key: str) -> bool:
        cur = self.tasks.get(key)
        return cur is not None and not cur[1].done()

    def release(self, key: str) -> None:
        """Stop supervising ``key`` (its instance stops it: its end is no news)."""
        cur = self.tasks.pop(key, None)
        if cur is not None:
            cur[1].cancel()

    def ack(self, refs: list[EndRef]) -> None:
        """The ends the control plane told: forgotten (a newer end of the same key stays)."""
        for r in refs:
            e = self.ended.get(r.key)
            if e is not None and e.pid == r.pid:
                del self.ended[r.key]

    def report(self) -> list[ProcessEnd] | None:
        """The ends not yet acknowledged, in the order they came (at most MAX_ENDED: the rest next time)."""
        return list(self.ended.values())[:MAX_ENDED] or None

    def close(self) -> None:
        """The agent stops: its supervision ends, its processes stay (the next run adopts them)."""
        for _, task in self.tasks.values():
            task.cancel()
        self.tasks.clear()

    def _keep(self, req: p.LaunchRequest, end: ProcessEnd) -> None:
        cur = self.tasks.get(req.key)
        if cur is not None and cur[0] == end.pid:
            del self.tasks[req.key]
        self.ended.pop(end.key, None)  # to the end of the order: the newest end is reported last
        self.ended[end.key] = end
        self.news.set()
        try:
            self.on_end(req, end)
        except Exception:  # noqa: BLE001  metrics and the usage book's OOM mark: never the end's news
            log.exception("counting the end of %s failed", req.key)

    async def _run(self, req: p.LaunchRequest, rec: Record) -> None:
        """Supervise until the end, and keep it. A fault of the supervision itself (a probe or a log
        read that raised) is logged and the supervision goes on: no end is made up for it."""
        while True:
            try:
                end = await self.until_end(req, rec)
                break
            except Exception:  # noqa: BLE001  a process's supervision must outlive its own faults
                log.exception("supervising %s (pid %s) failed; supervising it again in 1 s", req.key, rec.pid)
                await asyncio.sleep(1.0)
        self._keep(req, end)

    async def until_end(self, req: p.LaunchRequest, rec: Record) -> ProcessEnd:
        """Wait until the process ends (the table wakes the wait; a real process is looked at every
        second) or, for a server with ``liveness_s``, fails its health check too often (then it is
        stopped here); how it ended."""
        what = "" if req.role == "server" else f"{req.role} {req.part} on {self.name}: "
        probing = rec.port is not None and req.role == "server" and req.liveness_s > 0
        next_probe, misses = time.monotonic() + req.liveness_s, 0
        while True:
            if probing and time.monotonic() >= next_probe:
                next_probe = time.monotonic() + req.liveness_s
                misses = 0 if await self.probe(req, rec) else misses + 1
                if misses >= req.liveness_failures:
                    await self.stop(req.key)
                    return ProcessEnd(key=req.key, pid=rec.pid, reason=(
                        f"{what}failed its health check {misses} times in a row (port {rec.port}); stopped"))
            rc = self.table.returncode(rec.pid)
            if rc is not None:
                self._forget(req.key, rec.pid)
                how = f"exited with code {rc}" if rec.pid in self.table.children else \
                    "ended (adopted from an earlier agent run: exit code unknown)"
                why = f"{what}{how}: {self.table.tail(req.key)}".rstrip(": ")
                return ProcessEnd(key=req.key, pid=rec.pid, returncode=rc, reason=why[:REASON_MAX])
            await self.table.wait_exit(rec.pid, max(0.0, next_probe - time.monotonic()) if probing else 3600.0)

    def _forget(self, key: str, pid: int) -> None:
        """Forget ``key``'s ended process, unless the key names a newer one by now."""
        cur = self.table.find(key)
        if cur is not None and cur.pid == pid:
            self.table.forget(key)
