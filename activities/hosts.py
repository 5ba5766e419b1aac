"""The host activities (task queue ``gpuflow-control``; the host workflow and the estimate call
them): a host's report recorded, a host lost, forgotten or cordoned, its replicas' measured memory
recorded, the instances placed there told what its watch learned (activities/host_news.py), and the
local model paths the GPU hosts read for an estimate (activities/host_estimate.py). Each takes one
input (contracts/hosts.py, or the host's HostReport)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from typing import Awaitable, Callable

from pydantic import ValidationError
from sqlalchemy.engine import Engine
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from activities import callers, host_news
from activities.host_auth import HostAuthActivities
from activities.host_estimate import readers, record_paths
from activities.placement import valid_spec
from activities.runner import Runner
from contracts import activity_names as c, run_nonce
from contracts.control import HostNews, HostReport
from contracts.host_auth import ReportCheck, ReportVerdict
from contracts.host_proof import refused
from contracts.hosts import HostCordon, HostLost, HostRef, ModelPaths, ReadersAsk
from contracts.usage import RECORD_USAGE, UsageBatch
from contracts.estimate_inputs import ReaderHosts
from scheduler.claims.settings import ClaimSettings
from store import claims, host_credentials, ledger, records, usage

log = logging.getLogger("gpuflow.hosts")


class HostStateActivities:
    def __init__(self, engine: Engine, reads: Engine, client: Client, runner: Runner,
                 wake: Callable[[], Awaitable[int]], auth: HostAuthActivities, claims: ClaimSettings | None = None):
        """``reads``: the read-only engine (db.reader); ``wake``: the PENDING queue's wake
        (wake_queue.Waker), when a host's capacity changed; ``auth``: the reports' check (its rule
        and its count of refusals), which host_seen runs again."""
        self.engine, self.reads, self.client, self.runner, self.wake = engine, reads, client, runner, wake
        self.auth = auth
        self.claims = claims or ClaimSettings()  # the recommender's settings (GPUFLOW_CLAIMS__*)
        self.waking: set[asyncio.Task] = set()  # wakes after a learned claim became confident (kept referenced)

    def all(self) -> list:
        return [self.host_seen, self.host_lost, self.host_forget, self.host_cordon, self.model_readers,
                self.record_model_paths, self.record_usage]

    @activity.defn(name=c.HOST_SEEN)
    async def host_seen(self, seen: ReportCheck) -> None:
        """The host's report (a hello, or its inventory changed), as its workflow's check took it,
        signed: checked again here (``proven``), then recorded READY. A hello from a new agent run
        (HostReport.boot) tells the instances placed there to ask it to supervise their processes; the
        processes that ended (HostReport.ended) are told to their instances (``_tell_ended``)."""
        callers.check(c.HOST_SEEN, seen)
        report = await self.runner.run(self.proven, seen, activity.info().workflow_run_id)
        changed, restarted = await self.runner.run(records.see_worker, self.engine, report, "ready")
        if restarted or activity.info().attempt > 1:
            await self._tell_instances_on(report.name, "restarted", "its agent restarted")
        if report.ended:
            await self._tell_ended(report)
        if changed or activity.info().attempt > 1:  # as release_placement: a retry may follow a lost wake
            await self.wake()

    def proven(self, seen: ReportCheck, run_id: str) -> HostReport:
        """The report, when it passes the host workflow's own rule again (contracts/host_proof.py
        ``judge``, against the store's credential, on this worker's clock): a joined host's, its MAC
        verifies, and it is fresh (the hello the check took last passes again, an older one does
        not; a watch's nonce is one this caller's run made: contracts/run_nonce.py). Anybody's
        workflow named ``host/<name>``, run while the host's own is not, may call host_seen: a
        report that fails writes nothing (ReportRefused, non-retryable, its kind in the details),
        and is counted and logged as the check's refusals are."""
        check = seen.model_copy(update={"now_ms": int(time.time() * 1000), "after_ms": 0})
        verdict = self.auth.recheck(check)
        if verdict.ok and seen.purpose == "watch" and not run_nonce.of_run(seen.nonce, run_id):
            verdict = refused("replay", f"host {seen.host}'s watch report answers a watch this workflow run did not "
                                        "send: a report replayed from another run's history")
        report = _report_of(seen, verdict)
        if isinstance(report, ReportVerdict):
            self.auth.refused.labels(report.kind).inc()
            log.warning("host_seen refused a report of host %s (%s): %s", seen.host, report.kind, report.why)
            raise ApplicationError(f"host {seen.host}'s report writes no inventory: {report.why}", report.kind,
                                   type="ReportRefused", non_retryable=True)
        return report

    @activity.defn(name=c.HOST_LOST)
    async def host_lost(self, lost: HostLost) -> None:
        """The host's watch failed: NOT_READY, and the instances placed there hear it at once."""
        callers.check(c.HOST_LOST, lost)
        await self.runner.run(records.set_worker_state, self.engine, lost.name, "not_ready", lost.reason)
        await self._tell_instances_on(lost.name, "lost", lost.reason.removeprefix("agent stopped answering: ")[:500])

    async def _tell_instances_on(self, host: str, kind: str, why: str) -> None:
        """The instances holding ledger lines on ``host`` hear what its watch learned (host_news.py)."""
        await host_news.tell(self.client, await self.runner.run(ledger.instances_on, self.reads, host),
                             HostNews(host=host, kind=kind, why=why))

    async def _tell_ended(self, report: HostReport) -> None:
        """Each process end the (proven) report carries, told to its instance when that instance holds
        ledger lines on this host: a host speaks for the processes placed on it, never for others."""
        here = set(await self.runner.run(ledger.instances_on, self.reads, report.name))
        await host_news.tell_each(self.client, host_news.ends(report.name, report.ended or [], here))

    @activity.defn(name=c.HOST_FORGET)
    async def host_forget(self, host: HostRef) -> str | None:
        """An operator forgets a host that is gone for good: its row and its credential leave the
        store (None; its next agent joins afresh, with the join token), or the reason it may not yet
        (records.forget_worker)."""
        callers.check(c.HOST_FORGET, host)
        problem = await self.runner.run(records.forget_worker, self.engine, host.name)
        if problem is None:
            await self.runner.run(host_credentials.forget, self.engine, host.name)
        return problem

    @activity.defn(name=c.HOST_CORDON)
    async def host_cordon(self, cordon: HostCordon) -> bool | None:
        """An operator cordoned or uncordoned the host (records.cordon_worker). Uncordoned, it may
        take the PENDING replicas: the queue is woken (again on a retry, as host_seen)."""
        callers.check(c.HOST_CORDON, cordon)
        changed = await self.runner.run(records.cordon_worker, self.engine, cordon.name, cordon.on, cordon.reason)
        if not cordon.on and (changed or activity.info().attempt > 1):
            await self.wake()
        return changed

    @activity.defn(name=RECORD_USAGE)
    async def record_usage(self, batch: UsageBatch) -> int:
        """One host's measured memory per replica, in one transaction (store/usage.py); a local
        activity of the host workflow, run on each of its watch's returns that carries figures. A
        learned claim that became confident with it wakes the PENDING queue, in the background (the
        host's workflow does not wait for it): under mode apply a waiting replica may fit with the
        learned claim, where the sweep would see it only within pending_recheck_s."""
        callers.check(RECORD_USAGE, batch)
        became: list[str] = []
        n = await self.runner.run(self._record_usage, batch, became)
        if became:
            task = asyncio.get_running_loop().create_task(self._wake_for(became), context=contextvars.Context())
            self.waking.add(task)
            task.add_done_callback(self.waking.discard)
        return n

    async def _wake_for(self, keys: list[str]) -> None:
        try:
            woken = await self.wake()
            log.info("learned claims confident (%s): the PENDING queue woke %d", ", ".join(keys), woken)
        except Exception as e:  # noqa: BLE001  the next wake or the sweep judges again
            log.warning("waking the PENDING queue after learned claims became confident: %s", e)

    def _record_usage(self, batch: UsageBatch, became: list[str] | None = None) -> int:
        """The figures (store/usage.py), then the learned claims' samples (store/claims.py): each its
        own transaction; a failure to learn is logged and loses no figures. ``became``: the
        fingerprints this batch made confident."""
        n = usage.record(self.engine, batch)
        try:
            claims.observe_batch(self.engine, batch, self.claims, time.time(), became)
        except Exception:  # noqa: BLE001  (learning is an addition: it never stops the figures)
            log.exception("learning claims from %s's usage report failed", batch.host)
        return n

    @activity.defn(name=c.MODEL_READERS)
    async def model_readers(self, ask: ReadersAsk) -> ReaderHosts:
        """The hosts to ask to read a local model path (scheduler/model_readers.py), and why the others were not."""
        return await self.runner.run(readers, self.engine, valid_spec(ask.spec))

    @activity.defn(name=c.RECORD_MODEL_PATHS)
    async def record_model_paths(self, paths: ModelPaths) -> None:
        """Which hosts hold the path and which looked and did not find it (the local-path filter reads
        them): for a replica its deployment wants, by that replica's workflow."""
        callers.check(c.RECORD_MODEL_PATHS, paths)
        why = await self.runner.run(records.unwanted_problem, self.reads, paths.instance or "")
        if why:
            raise ApplicationError(f"record_model_paths records only for a replica its deployment wants: {why}",
                                   type="InvalidInput", non_retryable=True)
        await self.runner.run(record_paths, self.engine, paths.path, paths.present, paths.missing)


def _report_of(seen: ReportCheck, verdict: ReportVerdict) -> HostReport | ReportVerdict:
    """The report without its auth, once ``verdict`` passed it and it validates as host ``seen.host``'s."""
    if not verdict.ok:
        return verdict
    try:
        report = HostReport.model_validate(seen.report)
    except ValidationError as e:
        return refused("garbage", f"host {seen.host}'s report does not validate: {e.errors(include_url=False)[0]}")
    if report.name != seen.host:
        return refused("garbage", f"host {seen.host}'s report names host {report.name!r}")
    return report.model_copy(update={"auth": None})
