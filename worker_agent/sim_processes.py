"""A simulated process runner behind the agent's process seam (ProcessTable), for ``gpuflow
simulate``: nothing is forked. A "started" server opens a real listening socket in this process
on its port after ``start_delay`` and answers HTTP (200 on /health, /v1/models and /; a small
/metrics), so the agent's own readiness and liveness probes pass as they do for a real engine.
Stopping it closes the socket. With ``fail_rate``, that share of launches exits with code 1
instead of listening. Each instance's log is a real file, so ``gpuflow logs`` reads it."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import shlex
import time

from worker_agent.processes import ProcessTable, Record, hide

_PIDS = itertools.count(10_000_000)  # above any kernel's pid_max: never a real process


class _Server:
    def __init__(self, rec: Record, fails: bool):
        self.rec, self.fails = rec, fails
        self.returncode: int | None = None
        self.listener: asyncio.AbstractServer | None = None
        self.task: asyncio.Task | None = None
        self.ended = asyncio.Event()  # set with returncode: the agent's supervision waits on it, not on a clock

    def exit(self, code: int) -> None:
        self.returncode = code
        self.ended.set()


class SimulatedProcessTable(ProcessTable):
    runs = "nothing"  # nothing is forked: any command "runs" (scheduler/filters/command.py keeps the host)

    def __init__(self, data_dir: str, start_delay: float = 0.5, fail_rate: float = 0.0,
                 rng: random.Random | None = None):
        super().__init__(data_dir)
        self.start_delay, self.fail_rate = start_delay, fail_rate
        self.rng = rng or random.Random()
        self.servers: dict[str, _Server] = {}
        self._by_pid: dict[int, _Server] = {}

    def _log(self, instance: str, line: str) -> None:
        with open(self.log_path(instance), "a") as f:
            f.write(line + "\n")

    def start(self, instance: str, argv: list[str], env: dict[str, str], port: int | None,
              kv_events_port: int | None = None, key_id: str | None = None, secret: str | None = None,
              bootstrap_port: int | None = None) -> Record:
        argv = hide(argv, secret)
        self._log(instance, f"--- gpuflow: starting {shlex.join(argv)}")
        self._log(instance, f"simulated: not forked; listening on port {port} in {self.start_delay:g} s")
        rec = Record(instance, next(_PIDS), port, argv, self.log_path(instance), kv_events_port=kv_events_port,
                     key_id=key_id, bootstrap_port=bootstrap_port)
        srv = _Server(rec, self.rng.random() < self.fail_rate)
        self.servers[instance] = self._by_pid[rec.pid] = self.children[rec.pid] = srv  # children: "our child"
        srv.task = asyncio.get_running_loop().create_task(self._run(srv))
        return rec

    async def _run(self, srv: _Server) -> None:
        await asyncio.sleep(self.start_delay)
        if srv.returncode is not None:
            return
        if srv.fails:
            self._log(srv.rec.instance, "simulated: launch failure (--fail-rate)")
            srv.exit(1)
            return
        if srv.rec.port is not None:
            try:
                srv.listener = await asyncio.start_server(lambda r, w: _answer(srv.rec, r, w), "127.0.0.1",
                                                          srv.rec.port)
            except OSError as e:
                self._log(srv.rec.instance, f"simulated: cannot listen on {srv.rec.port}: {e.strerror}")
                srv.exit(98)
                return
        self._log(srv.rec.instance, "simulated: ready")

    def find(self, instance: str) -> Record | None:
        srv = self.servers.get(instance)
        return srv.rec if srv else None

    def records(self) -> list[Record]:
        return [self.servers[k].rec for k in sorted(self.servers)]

    def owner(self):
        pids = set(self._by_pid)
        return lambda pid: pid in pids

    def returncode(self, pid: int) -> int | None:
        srv = self._by_pid.get(pid)
        return -1 if srv is None else srv.returncode

    async def wait_exit(self, pid: int, timeout: float) -> None:
        """Woken by the end itself: a thousand supervised processes in one simulator do not each look every
        second."""
        srv = self._by_pid.get(pid)
        if srv is None or srv.returncode is not None:
            return
        try:
            await asyncio.wait_for(srv.ended.wait(), max(0.0, timeout))
        except asyncio.TimeoutError:
            pass

    def signal_group(self, pid: int, sig: int) -> None:
        srv = self._by_pid.get(pid)
        if srv is not None and srv.returncode is None:
            self._end(srv, -int(sig))

    def _end(self, srv: _Server, code: int) -> None:
        srv.exit(code)
        if srv.task is not None and not srv.task.done():
            srv.task.cancel()
        if srv.listener is not None:
            srv.listener.close()
        self._log(srv.rec.instance, f"simulated: ended ({code})")

    async def stop(self, instance: str, grace_s: float) -> bool:
        srv = self.servers.get(instance)
        if srv is None:
            return False
        if srv.returncode is None:
            self._end(srv, -15)
        self.forget(instance)
        return True

    def forget(self, instance: str) -> None:
        srv = self.servers.pop(instance, None)
        if srv is not None:
            self._by_pid.pop(srv.rec.pid, None)
            self.children.pop(srv.rec.pid, None)
            if srv.returncode is None:
                self._end(srv, -9)

    def vanish(self) -> None:
        """The host is gone: every server ends at once, nothing is logged as stopped by us."""
        for srv in list(self.servers.values()):
            if srv.returncode is None:
                self._end(srv, -9)


async def _answer(rec: Record, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    try:
        line = await asyncio.wait_for(r.readline(), 5)
        while (await asyncio.wait_for(r.readline(), 5)) not in (b"\r\n", b"\n", b""):
            pass  # headers
        path = line.split()[1].decode() if len(line.split()) > 1 else "/"
        status, body, kind = 200, b"", "application/json"
        if path.startswith("/v1/models"):
            body = json.dumps({"object": "list", "data": [{"id": rec.instance, "object": "model"}]}).encode()
        elif path.startswith("/health"):
            body = b"{}"
        elif path.startswith("/metrics"):
            kind = "text/plain; version=0.0.4"
            body = f"simulated_server_up 1\nsimulated_server_started_seconds {rec.started_at:.0f}\n".encode()
        elif path == "/":
            up = time.time() - rec.started_at
            body = json.dumps({"simulated": True, "instance": rec.instance, "uptime_s": up}).encode()
        else:
            status, body = 404, b'{"error": "simulated server: not found"}'
        w.write(f"HTTP/1.0 {status} {'OK' if status == 200 else 'Not Found'}\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await w.drain()
    except (OSError, asyncio.TimeoutError, IndexError, UnicodeDecodeError):
        pass
    finally:
        w.close()
