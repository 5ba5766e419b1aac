"""The agent's activities, on its own task queue ``gpuflow-host-<name>``: report the host's
inventory (a heartbeating watch), launch an instance and wait until it is ready (then this agent
supervises it: supervision.py, its end carried on the watch's report), supervise an adopted one
once its instance asks, stop it. Expected failures are ApplicationErrors with a type the workflows read:
LaunchFailed (non-retryable: the command cannot start or never became ready), LaunchRefused
(non-retryable: the spec asks what this host does not allow), InvalidSpec (non-retryable: the
request itself is wrong, e.g. a run_command that cannot be split or an env the OS refuses),
InvalidName (non-retryable: a name from the caller that is not a name; nothing on the host is
touched). The refusals make the instance ERROR with the reason, not restarted or re-placed."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace
from typing import Callable

from temporalio import activity
from temporalio.exceptions import ApplicationError

from contracts.host import Booking, HostReport
from contracts.host_auth import WatchAsk
from contracts.process_end import ProcessEnd
from scheduler.errors import GpuflowError, InvalidInput
from scheduler.naming import check_key, check_name
from scheduler.spec import Source
from contracts import agent as p
from scheduler.claim_apply import is_oom
from contracts import launch_proof
from worker_agent import pd_argv, pinning
from worker_agent.bookings import BookingUnknown, Bookings, TakenProofs, part_of, refusal
from worker_agent.credential import HostCredential
from worker_agent.downloads import DownloadFailed, HubConfig, NotOnHub, Progress, fetch, wanted
from worker_agent.engine_key import EngineKeys, key_env, new_nonce, sglang_config, write_secret
from worker_agent.health import engine_answers, tcp_answers
from worker_agent.inventory import booked_here, judged
from worker_agent.engines import (EngineConfig, EngineUnavailable, LaunchRefused, argv_for, check_launch, engine_env,
                                     needs_port, wants_kv_events)
from worker_agent.metrics import AgentMetrics
from worker_agent.processes import ProcessTable, free_port, free_ports, visibility_env
from worker_agent.supervision import Supervision
from worker_agent.usage import UsageBook


def _valid(check, *args) -> None:
    """A name that came through Temporal, checked before it reaches a file or a process."""
    try:
        check(*args)
    except InvalidInput as e:
        raise ApplicationError(str(e), type="InvalidName", non_retryable=True) from None


BEAT_CAP_S = 5.0


def _beat_every() -> float:
    """How often to heartbeat: a quarter of the heartbeat timeout, at most BEAT_CAP_S seconds."""
    hb = activity.info().heartbeat_timeout
    return max(0.1, min(hb.total_seconds() / 4, BEAT_CAP_S)) if hb else BEAT_CAP_S


def _dist_port(argv: list[str]) -> int | None:
    """The port of an SGLang rank 0's --dist-init-addr HOST:PORT (from its argv: an adopted process too)."""
    if "--dist-init-addr" not in argv[:-1]:
        return None
    return int(argv[argv.index("--dist-init-addr") + 1].rsplit(":", 1)[1])


class HostActivities:
    def __init__(self, name: str, table: ProcessTable, discover: Callable[[], HostReport], *, bookings: Bookings,
                 stop_grace_s: float = 10.0, poll_s: float = 0.2, engines: EngineConfig | None = None,
                 metrics: AgentMetrics | None = None, address: str = "127.0.0.1", hub: HubConfig | None = None,
                 usage: UsageBook | None = None, credential: EngineKeys | None = None):
        self.name, self.table, self.discover = name, table, discover
        self.credential = credential  # makes each server's engine key (engine_key.py); None: engines run open
        self.bookings = bookings  # the ledger, asked before any process starts (bookings.py)
        self.proofs = TakenProofs()  # the bookings the control plane signed, each taken once (bookings.py)
        self.hub = hub or HubConfig(cache_dir=os.path.join(os.path.dirname(table.run_dir), "models"))
        self.address = address  # where other hosts reach this host's helper processes
        self.engines = engines or EngineConfig()
        if self.engines.model_roots:  # what this agent downloaded is allowed too
            self.engines = replace(self.engines, model_roots=(*self.engines.model_roots, self.hub.cache_dir))
        self.metrics = metrics
        self.usage = usage  # each replica's measured memory (usage.py): carried on the watch's return
        # every process launched or adopted here, supervised by this agent (supervision.py): its end
        # is carried on the watch's return
        self.supervision = Supervision(table, self._probe, self._stop, self._ended, name)
        self.stop_grace_s, self.poll_s = stop_grace_s, poll_s

    def all(self) -> list:
        return [self.watch_host, self.prepare_model, self.launch_instance, self.supervise_instance, self.stop_instance]

    @activity.defn(name=p.WATCH_HOST)
    async def watch_host(self, ask: WatchAsk) -> dict:
        """Heartbeat while the inventory stays as ``ask.known`` (its fingerprint); return the new
        report as soon as it differs, or after the schedule-to-close budget runs low, or when the
        replicas' measured memory is news (usage.py), or a supervised process ended (supervision.py):
        the report carries that memory and those ends (the ones ``ask.acked`` names are forgotten
        first). It is signed with the host's credential for the watch's nonce (contracts/host_proof.py)."""
        self.supervision.ack(ask.acked)
        report = await self._watch(ask.known)
        body = report.model_dump(mode="json", exclude={"auth"})
        signer = self.credential if isinstance(self.credential, HostCredential) else None
        return signer.signed(body, "watch", ask.nonce) if signer else body

    async def _watch(self, known: str) -> HostReport:
        info = activity.info()
        deadline = time.monotonic() + (info.start_to_close_timeout.total_seconds() * 0.8
                                       if info.start_to_close_timeout else 300)
        every = _beat_every()
        news = self.supervision.news
        while True:
            news.clear()
            report = await asyncio.to_thread(self.discover)
            if self.usage is not None:
                self.usage.gpu_names = {g.index: g.name for g in report.gpus}
                report = judged(report, booked_here(list(self.usage.requests.values())))  # foreign use past the room
            ended = self.supervision.report()
            if report.fingerprint() != known or time.monotonic() > deadline or (self.usage and self.usage.due()) \
                    or ended:
                return report.model_copy(update={"usage": self.usage.report() if self.usage else None, "ended": ended})
            activity.heartbeat(report.fingerprint())
            try:
                await asyncio.wait_for(news.wait(), every)  # a process's end wakes it
            except asyncio.TimeoutError:
                pass

    @activity.defn(name=p.PREPARE_MODEL)
    async def prepare_model(self, req: p.ModelFetch) -> p.ModelReady:
        """The source's files on this host: found in the model cache, or downloaded into it while
        heartbeating the progress. Errors: ModelNotFound (not retried: no such repository or
        file, or no client for the hub), DownloadFailed (retried: the next attempt resumes)."""
        _valid(check_name, "instance", req.instance)
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
        _valid(check_key, req.key)
        try:
            check_launch(req, self.engines)
        except LaunchRefused as e:
            raise ApplicationError(str(e), type="LaunchRefused", non_retryable=True) from None
        booking = await self._check_booking(req)
        key = req.key
        rec = self.table.find(key)
        adopted = rec is not None and self.table.alive(rec.pid)
        bound = f"running on CPUs {pinning.allowed(rec.pid)}" if adopted and req.cpu_pinning else ""
        if not adopted:
            port = free_port() if needs_port(req) else None
            kv_port = free_port() if wants_kv_events(req, self.engines) else None
            pd = pd_argv.ports_wanted(req)  # a prefill/decode member's KV hand-off: free ports picked here
            pd_kv, pd_boot = free_ports(pd.kv) if pd.kv else None, free_port() if pd.bootstrap else None
            if req.backend == "sglang" and req.role == "server" and (req.nnodes or 1) > 1 and not req.dist_init_addr:
                # SGLang's rank 0: the other nodes meet it at this host's address, on a port picked here
                req = req.model_copy(update={"dist_init_addr": f"{self.address}:{free_port()}"})
            argv = [req.backend]
            nonce = new_nonce() if req.role == "server" and self.credential is not None else None
            secret = self._engine_key(req, nonce)
            try:
                argv = argv_for(req, port, self.engines, self.address, kv_port, secret, self._key_file(req, secret),
                                kv_port=pd_kv, bootstrap_port=pd_boot)
                argv, bound = pinning.wrap(argv, req)
                env = {**req.env, **engine_env(req), **pd_argv.pd_env(req, self.address, pd_kv, pd_boot),
                       **visibility_env(req.gpu_vendor, req.gpu_indexes),
                       **key_env(req, bool(self.engines.llama_cpp_python), secret)}
                rec = self.table.start(key, argv, env, port, kv_port, key_id=nonce, secret=secret,
                                       bootstrap_port=pd_argv.recorded(pd_kv, pd_boot))
            except LaunchRefused as e:
                raise ApplicationError(str(e), type="LaunchRefused", non_retryable=True) from None
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
        if self.usage is not None:
            self.usage.watch(req, booking)  # measured against the ledger's claim, never the request's
        if not req.wait_ready:
            self.supervision.supervise(req, rec)  # this agent supervises it from now on
            return self._result(req, rec, adopted, dist, bound)
        started = time.monotonic()
        # The first heartbeat after ``every``, not at once: the activity's start counts for the
        # heartbeat timeout, and a server ready within it (a custom server, a cached small model)
        # costs the Temporal server no heartbeat write at all.
        every, last_beat = _beat_every(), started
        while True:
            rc = self.table.returncode(rec.pid)
            if rc is not None:
                self.table.forget(key)
                what = "" if req.role == "server" else f"{req.role} {req.part}: "
                raise ApplicationError(f"{what}exited with code {rc} while starting: {self.table.tail(key)}",
                                       {"pid": rec.pid, "returncode": rc}, type="LaunchFailed", non_retryable=True)
            if rec.port is not None:
                if await self._answers(req, rec.port, key=self._engine_key(req, rec.key_id)):
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
        self.supervision.supervise(req, rec)  # this agent supervises it from now on
        return self._result(req, rec, adopted, dist, bound)

    def _result(self, req: p.LaunchRequest, rec, adopted: bool, dist: int | None, bound: str) -> p.LaunchResult:
        """The launch's result, MACed with the host key (contracts/launch_proof.py): the store writes
        the replica RUNNING at this address only when the MAC verifies with this host's credential.
        An adopted process's figures are the same, and so is its MAC."""
        fields = launch_proof.body(req.instance, req.part, rec.pid, rec.port, self.address, rec.key_id,
                                   rec.kv_events_port, rec.bootstrap_port)
        mac = launch_proof.sign(self.credential.key, self.name, fields) if self.credential is not None else ""
        return p.LaunchResult(pid=rec.pid, port=rec.port, adopted=adopted, argv=rec.argv, log=rec.log,
                              address=self.address, dist_port=dist, binding=bound,
                              kv_events_port=rec.kv_events_port, bootstrap_port=rec.bootstrap_port, key_id=rec.key_id,
                              mac=mac)

    async def _check_booking(self, req: p.LaunchRequest) -> Booking:
        """No process without its booking: the ledger, not the request, says which processes (parts)
        the instance may run on this host, in which role and on which GPUs (bookings.py). Refused
        with NotBooked (not retried) when it holds none here, or not this part, role or these GPUs:
        its workflow places it again; retried (BookingUnknown) when the control plane cannot be asked."""
        booking = self._signed(req)
        if booking is None:
            try:
                booking = await self.bookings.booked(p.instance_of(req.key))
            except BookingUnknown as e:
                raise ApplicationError(str(e), type="BookingUnknown") from None
        why = refusal(req.key, self.name, req.role, list(req.gpu_indexes), booking)
        if why:
            if self.metrics:
                self.metrics.failures.labels(self.name, req.backend).inc()
            raise ApplicationError(why, type="NotBooked", non_retryable=True)
        self.table.seen_booked(req.key)
        return booking

    def _signed(self, req: p.LaunchRequest) -> Booking | None:
        """The booking the control plane signed for this launch with this host's key
        (contracts/booking_proof.py), when it holds: for this instance here, fresh, not taken
        before. None (no proof, no credential, a helper's launch, or one that does not hold): the
        ledger is asked."""
        if req.booking_proof is None or self.credential is None or req.part:
            return None
        got, why = self.proofs.booking(self.credential.key, req.booking_proof, p.instance_of(req.key), self.name)
        if why:
            activity.logger.info("%s: %s; asking the ledger", req.key, why)
        return got

    async def _watch_booked(self, req: p.LaunchRequest) -> None:
        """A supervised process that the usage book does not measure yet (adopted by a new agent run):
        measured once the ledger says its part is booked here, against the ledger's claim; a part
        not booked (or a ledger that does not answer) is not measured, nor reported."""
        if self.usage is None or self.usage.watching(req.key):
            return
        try:
            booking = await self.bookings.booked(p.instance_of(req.key))
        except BookingUnknown:
            return
        if booking.booked and booking.part(part_of(req.key)) is not None:
            self.table.seen_booked(req.key)
            self.usage.watch(req, booking)

    async def _answers(self, req: p.LaunchRequest, port: int, timeout: float = 1.0, key: str | None = None) -> bool:
        if req.role == "server":
            return await engine_answers(port, req.backend, timeout, self.address, key)
        return await tcp_answers(self.address, port, timeout)

    def _engine_key(self, req: p.LaunchRequest, nonce: str | None) -> str | None:
        """The server's engine key made from ``nonce`` (a launch's, or an adopted process's pid file's)."""
        if nonce is None or self.credential is None or req.role != "server":
            return None
        return self.credential.engine_key(req.instance, req.part, nonce)

    def _key_file(self, req: p.LaunchRequest, key: str | None) -> str | None:
        """SGLang reads its key from a 0600 --config file (engine_key.py), written here before it starts."""
        if key is None or req.backend != "sglang":
            return None
        path = self.table.secret_path(req.key)
        write_secret(path, sglang_config(key))
        return path

    @activity.defn(name=p.SUPERVISE_INSTANCE)
    async def supervise_instance(self, req: p.LaunchRequest) -> p.ExitReport | None:
        """This agent run supervises the process of ``req`` from now on (supervision.py): None. Asked
        by its instance once this agent said hello as a new run (it adopted the process from its pid
        file). An ExitReport when the process is not running here: it ended while no agent watched."""
        _valid(check_key, req.key)
        rec = self.table.find(req.key)
        if rec is None or not self.table.alive(rec.pid):
            if rec is not None:
                self.table.forget(req.key)
            what = "" if req.role == "server" else f"{req.role} {req.part} on {self.name}: "
            return p.ExitReport(pid=rec.pid if rec else None, reason=f"{what}the process is not running on this host")
        await self._watch_booked(req)  # an adopted process is measured against its claim again
        self.supervision.supervise(req, rec)
        return None

    def _ended(self, req: p.LaunchRequest, end: ProcessEnd) -> None:
        """A supervised process ended (supervision.py): counted, and a learned OOM marked for the usage report."""
        if self.metrics:
            self.metrics.exits.labels(self.name, req.backend).inc()
        if self.usage is not None and is_oom(end.reason):
            self.usage.mark_oom(req.key)  # its next report says so: its learned claim is bumped

    async def _probe(self, req: p.LaunchRequest, rec) -> bool:
        return await engine_answers(rec.port, req.backend, timeout=min(5.0, req.liveness_s),
                                    address=self.address, key=self._engine_key(req, rec.key_id))

    @activity.defn(name=p.STOP_INSTANCE)
    async def stop_instance(self, instance: str) -> bool:
        """SIGTERM the process group of the instance and of each of its helpers on this host, wait
        the grace period, SIGKILL. Idempotent."""
        _valid(check_name, "instance", instance)
        keys = [r.instance for r in self.table.records() if p.instance_of(r.instance) == instance]
        for k in set(keys) | {instance}:
            self.supervision.release(k)  # asked to stop: its end is no news
        stopped = [await self._stop(k) for k in sorted(set(keys) | {instance})]
        return any(stopped)

    async def _stop(self, instance: str) -> bool:
        return await self.table.stop(instance, self.stop_grace_s)
