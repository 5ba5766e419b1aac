"""The agent's activities, on its own task queue ``gpuflow-host-<name>``: report the host's
inventory (a heartbeating watch), launch an instance and wait until it is ready, supervise it
until it exits, stop it. Expected failures are ApplicationErrors with a type the workflows read:
LaunchFailed (non-retryable: the command cannot start or never became ready), InvalidSpec
(non-retryable: the request itself is wrong, e.g. a run_command that cannot be split or an env
the OS refuses; the instance is ERROR with the reason, not restarted or re-placed)."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace
from typing import Callable

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.payloads import HostReport
from scheduler.errors import GpuflowError, InvalidInput
from scheduler.spec import Source
from worker_agent import payloads as p
from worker_agent.downloads import DownloadFailed, HubConfig, NotOnHub, Progress, fetch, wanted
from worker_agent.engines import EngineConfig, EngineUnavailable, argv_for, engine_env, needs_port
from worker_agent.metrics import AgentMetrics
from worker_agent.processes import ProcessTable, free_port, visibility_env


def _beat_every() -> float:
    hb = activity.info().heartbeat_timeout
    return max(0.1, min(hb.total_seconds() / 4, 5.0)) if hb else 5.0


def health_paths(backend: str) -> tuple[str, ...] | None:
    """What readiness and liveness ask: an engine's /health or its OpenAI-compatible /v1/models
    (200 from either); a custom server's / (any status: it answered)."""
    return None if backend == "custom" else ("/health", "/v1/models")


async def engine_answers(port: int, backend: str, timeout: float = 1.0) -> bool:
    paths = health_paths(backend)
    if paths is None:
        return await http_answers(port, timeout)
    for path in paths:
        if await http_answers(port, timeout, path):
            return True
    return False


async def tcp_answers(address: str, port: int, timeout: float = 1.0) -> bool:
    """True when address:port accepts a connection (rpc-server, the Ray head: not HTTP)."""
    try:
        _, w = await asyncio.wait_for(asyncio.open_connection(address, port), timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    w.close()
    return True


async def http_answers(port: int, timeout: float = 1.0, path: str | None = None) -> bool:
    """True when 127.0.0.1:port answers an HTTP request: with any status line when ``path`` is
    None (GET /), with 200 for ``path``."""
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    try:
        w.write(f"GET {path or '/'} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
        await w.drain()
        line = await asyncio.wait_for(r.readline(), timeout)
        if path is None:
            return line.startswith(b"HTTP/")
        parts = line.split()
        return len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1] == b"200"
    except (OSError, asyncio.TimeoutError):
        return False
    finally:
        w.close()


def _dist_port(argv: list[str]) -> int | None:
    """The port of an SGLang rank 0's --dist-init-addr HOST:PORT (from its argv: an adopted process too)."""
    if "--dist-init-addr" not in argv[:-1]:
        return None
    return int(argv[argv.index("--dist-init-addr") + 1].rsplit(":", 1)[1])


class HostActivities:
    def __init__(self, name: str, table: ProcessTable, discover: Callable[[], HostReport],
                 stop_grace_s: float = 10.0, poll_s: float = 0.2, engines: EngineConfig | None = None,
                 metrics: AgentMetrics | None = None, address: str = "127.0.0.1", hub: HubConfig | None = None):
        self.name, self.table, self.discover = name, table, discover
        self.hub = hub or HubConfig(cache_dir=os.path.join(os.path.dirname(table.run_dir), "models"))
        self.address = address  # where other hosts reach this host's helper processes
        self.engines = engines or EngineConfig()
        if self.engines.model_roots:  # what this agent downloaded is allowed too
            self.engines = replace(self.engines, model_roots=(*self.engines.model_roots, self.hub.cache_dir))
        self.metrics = metrics
        self.stop_grace_s, self.poll_s = stop_grace_s, poll_s

    def all(self) -> list:
        return [self.watch_host, self.prepare_model, self.launch_instance, self.supervise_instance, self.stop_instance,
                self.read_log]

    @activity.defn(name=p.WATCH_HOST)
    async def watch_host(self, known: str) -> HostReport:
        """Heartbeat while the inventory stays as ``known`` (its fingerprint); return the new
        report as soon as it differs, or after the schedule-to-close budget runs low."""
        info = activity.info()
        deadline = time.monotonic() + (info.start_to_close_timeout.total_seconds() * 0.8
                                       if info.start_to_close_timeout else 300)
        every = _beat_every()
        while True:
            report = await asyncio.to_thread(self.discover)
            if report.fingerprint() != known or time.monotonic() > deadline:
                return report
            activity.heartbeat(report.fingerprint())
            await asyncio.sleep(every)

    @activity.defn(name=p.PREPARE_MODEL)
    async def prepare_model(self, req: p.ModelFetch) -> p.ModelReady:
        """The source's files on this host: found in the model cache, or downloaded into it while
        heartbeating the progress. Errors: ModelNotFound (not retried: no such repository or
        file, or no client for the hub), DownloadFailed (retried: the next attempt resumes)."""
        try:
            want = wanted(Source.model_validate(req.source))
        except ValueError as e:
            raise ApplicationError(f"invalid model source: {e}", type="ModelNotFound", non_retryable=True) from None
        if want is None:
            return p.ModelReady(path=req.source["local_path"])
        progress = Progress()
        job = asyncio.ensure_future(asyncio.to_thread(fetch, self.hub, want, progress))
        every = _beat_every()
        try:
            while not job.done():
                activity.heartbeat(p.DownloadProgress(what=want.what, done=progress.done,
                                                      total=progress.total).model_dump())
                await asyncio.wait({job}, timeout=every)
            path = job.result()
        except asyncio.CancelledError:
            progress.cancelled = True  # the thread stops at its next chunk; the partial file stays
            raise
        except NotOnHub as e:
            raise ApplicationError(str(e), type="ModelNotFound", non_retryable=True) from None
        except DownloadFailed as e:
            raise ApplicationError(str(e), type="DownloadFailed") from None
        return p.ModelReady(path=path, bytes=progress.done)

    @activity.defn(name=p.LAUNCH_INSTANCE)
    async def launch_instance(self, req: p.LaunchRequest) -> p.LaunchResult:
        try:
            res = await self._launch(req)
        except ApplicationError:
            if self.metrics:
                self.metrics.failures.labels(self.name, req.backend).inc()
            raise
        if self.metrics:
            self.metrics.launches.labels(self.name, req.backend, str(res.adopted).lower()).inc()
        return res

    async def _launch(self, req: p.LaunchRequest) -> p.LaunchResult:
        """Start the instance's process (or adopt the one a previous attempt started) and return
        once it is ready: its port answers HTTP (a helper's: accepts a connection), or, without a
        port, it has lived settle_s."""
        key = req.key
        rec = self.table.find(key)
        adopted = rec is not None and self.table.alive(rec.pid)
        if not adopted:
            port = free_port() if needs_port(req) else None
            if req.backend == "sglang" and req.role == "server" and (req.nnodes or 1) > 1 and not req.dist_init_addr:
                # SGLang's rank 0: the other nodes meet it at this host's address, on a port picked here
                req = req.model_copy(update={"dist_init_addr": f"{self.address}:{free_port()}"})
            argv = [req.backend]
            try:
                argv = argv_for(req, port, self.engines, self.address)
                env = {**req.env, **engine_env(req), **visibility_env(req.gpu_vendor, req.gpu_indexes)}
                rec = self.table.start(key, argv, env, port)
            except EngineUnavailable as e:  # this host lacks the engine: another host may have it
                raise ApplicationError(str(e), type="LaunchFailed", non_retryable=True) from None
            except (InvalidInput, ValueError) as e:  # the spec's fault (a NUL in env, say): no retry anywhere
                raise ApplicationError(f"invalid launch request: {e}", type="InvalidSpec", non_retryable=True) from None
            except GpuflowError as e:
                raise ApplicationError(str(e), type="LaunchFailed", non_retryable=True) from None
            except OSError as e:
                raise ApplicationError(f"cannot start {argv[0]!r}: {e.strerror}", type="LaunchFailed",
                                       non_retryable=True) from None
        dist = _dist_port(rec.argv)
        if not req.wait_ready:
            return p.LaunchResult(pid=rec.pid, port=rec.port, adopted=adopted, argv=rec.argv, log=rec.log,
                                  address=self.address, dist_port=dist)
        started = time.monotonic()
        every = _beat_every()
        last_beat = 0.0
        while True:
            rc = self.table.returncode(rec.pid)
            if rc is not None:
                self.table.forget(key)
                what = "" if req.role == "server" else f"{req.role} {req.part}: "
                raise ApplicationError(f"{what}exited with code {rc} while starting: {self.table.tail(key)}",
                                       {"pid": rec.pid, "returncode": rc}, type="LaunchFailed", non_retryable=True)
            if rec.port is not None:
                if await self._answers(req, rec.port):
                    break
            elif time.time() - rec.started_at >= req.settle_s:
                break
            if time.monotonic() - started > req.ready_timeout_s:
                await self._stop(key)
                raise ApplicationError(f"not ready within {req.ready_timeout_s:g} s (port {rec.port} never answered)",
                                       type="LaunchFailed", non_retryable=True)
            if time.monotonic() - last_beat > every:
                activity.heartbeat({"pid": rec.pid})
                last_beat = time.monotonic()
            await asyncio.sleep(self.poll_s)
        return p.LaunchResult(pid=rec.pid, port=rec.port, adopted=adopted, argv=rec.argv, log=rec.log,
                              address=self.address, dist_port=dist)

    async def _answers(self, req: p.LaunchRequest, port: int, timeout: float = 1.0) -> bool:
        if req.role == "server":
            return await engine_answers(port, req.backend, timeout)
        return await tcp_answers(self.address, port, timeout)

    @activity.defn(name=p.SUPERVISE_INSTANCE)
    async def supervise_instance(self, req: p.LaunchRequest) -> p.ExitReport:
        """Heartbeat while the process lives; return how it ended. Cancelled by the workflow:
        stop the process. Cancelled for any other reason (worker shutdown, workflow moved on):
        leave it running, so the next agent run can adopt it."""
        key = req.key
        what = "" if req.role == "server" else f"{req.role} {req.part} on {self.name}: "
        rec = self.table.find(key)
        if rec is None:
            return p.ExitReport(reason=f"{what}the process is not running on this host")
        every = _beat_every()
        next_probe, misses = time.monotonic() + req.liveness_s, 0
        try:
            while True:
                if rec.port is not None and req.role == "server" and req.liveness_s > 0 and \
                        time.monotonic() >= next_probe:
                    next_probe = time.monotonic() + req.liveness_s
                    ok = await engine_answers(rec.port, req.backend, timeout=min(5.0, req.liveness_s))
                    misses = 0 if ok else misses + 1
                    if misses >= req.liveness_failures:
                        await self._stop(key)
                        if self.metrics:
                            self.metrics.exits.labels(self.name, req.backend).inc()
                        return p.ExitReport(pid=rec.pid, reason=f"failed its health check {misses} times in a row "
                                            f"(port {rec.port}); stopped")
                rc = self.table.returncode(rec.pid)
                if rc is not None:
                    self.table.forget(key)
                    how = f"exited with code {rc}" if rec.pid in self.table.children else \
                        "ended (adopted from an earlier agent run: exit code unknown)"
                    if self.metrics:
                        self.metrics.exits.labels(self.name, req.backend).inc()
                    return p.ExitReport(pid=rec.pid, returncode=rc,
                                        reason=f"{what}{how}: {self.table.tail(key)}".rstrip(": "))
                activity.heartbeat({"pid": rec.pid})
                await asyncio.sleep(min(every, 1.0))
        except asyncio.CancelledError:
            d = activity.cancellation_details()
            if d is not None and d.cancel_requested:
                await self._stop(key)
            raise

    @activity.defn(name=p.READ_LOG)
    async def read_log(self, req: p.LogRequest) -> p.LogChunk:
        data, nxt, found = self.table.read_log(req.instance, req.offset, min(req.max_bytes, 1 << 20))
        return p.LogChunk(text=data.decode(errors="replace"), offset=nxt, found=found)

    @activity.defn(name=p.STOP_INSTANCE)
    async def stop_instance(self, instance: str) -> bool:
        """SIGTERM the process group of the instance and of each of its helpers on this host, wait
        the grace period, SIGKILL. Idempotent."""
        keys = [r.instance for r in self.table.records() if p.instance_of(r.instance) == instance]
        stopped = [await self._stop(k) for k in sorted(set(keys) | {instance})]
        return any(stopped)

    async def _stop(self, instance: str) -> bool:
        return await self.table.stop(instance, self.stop_grace_s)
