"""What the cluster's reads and the tenants file's apply do in the store, one function each, in
blocking code, and ``StoreReads``: the reads as a control-plane worker answers the queries of the
reads workflow (workflows/cluster_reads.py). The rows are the views' (views/keys.py,
views/tenancy.py), which the CLI's offline commands (``--data-dir``/``--database-url``) and the
web console read from the store themselves, so a page reads the same either way.

A read answers one page of rows (contracts/cluster.py ``Page``, at most ``PAGE_MAX``) and the
total: an answer stays small whatever the cluster's size, and the CLI asks page after page."""

from __future__ import annotations

from concurrent.futures import Executor, TimeoutError as Late
from datetime import datetime, timedelta, timezone
import os
import socket
import time
from typing import Callable

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from activities.wake_queue import judge_and_record, shown
from contracts.cluster import (AuditAsk, AuditView, ClaimsAsk, ClaimsView, KeysPage, Page, QueuePage, ServingAsk,
                               ServingView, SettingsAsk, SettingsView, TenantsApplied, TenantsPage, UsagePage)
from contracts.host import BookingsAsk, HostBookings
from store import bookings, decision_replay, keys, serving, tenants
from store.snapshot import load_snapshot
from store.tables import InstanceRow, utcnow
from scheduler.errors import InvalidInput
from scheduler.spec_timings import PER_DEPLOYMENT
from contracts.limits import ClusterPolicy, Limits
from scheduler.claims.settings import ClaimSettings
from scheduler.policy_config import PolicyConfig
from scheduler.request import Request
from scheduler.spec import ModelSpec
from scheduler.tenancy.config import TenantsFile
from views import claims as claims_view
from views.keys import key_usage_rows, key_view
from views.tenancy import queue_rows, stored_queue, tenant_rows

RequestOf = Callable[[ModelSpec], Request | None]
READ_S = 1.5  # a read's deadline: the query waits on the worker's workflow thread, which the SDK calls deadlocked at 2 s
JUDGE_S = 1.0  # the queue's fresh judgement, at most (a decision per waiting replica): then the store's reasons


def keys_page(engine: Engine, page: Page) -> KeysPage:
    return KeysPage(keys=[key_view(k) for k in keys.list_keys(engine, page.offset, page.limit)], total=keys.count(engine))


def key_usage_page(engine: Engine, page: Page, now: datetime) -> UsagePage:
    rows = key_usage_rows(engine, now)
    return UsagePage(rows=rows[page.offset:page.offset + page.limit], total=len(rows))


def tenants_page(engine: Engine, page: Page) -> TenantsPage:
    tf = tenants.load(engine)
    rows = tenant_rows(tf, tenants.usage(engine), tenants.pending_by_tenant(engine))
    return TenantsPage(queueing=tf.queueing, rows=rows[page.offset:page.offset + page.limit], total=len(rows))


def apply_tenants(engine: Engine, tf: TenantsFile, request_of: RequestOf, policy: PolicyConfig | None) -> TenantsApplied:
    """Store ``tf`` (store/tenants.py ``apply``: whole, or refused naming the problem), then give
    the PENDING replicas their reasons under it (activities/wake_queue.judge_and_record), for the
    specs ``request_of`` can cost; a spec it cannot keeps its own until its next wake."""
    v = tenants.apply(engine, tf)
    moved = judge_and_record(engine, load_snapshot(engine), request_of, policy)[1]
    names = [t.name for t in tf.tenants]
    return TenantsApplied(version=v, tenants=names[:20], count=len(names), queueing=tf.queueing, reasons=moved)


def queue_page(engine: Engine, page: Page, request_of: RequestOf, policy: PolicyConfig | None,
               now: datetime) -> QueuePage:
    """``gpuflow queue``: the queue judged on a fresh snapshot, its reasons recorded as a wake
    records them, and shown as recorded: what status, explain and the console show next."""
    v = judge_and_record(engine, load_snapshot(engine), request_of, policy)[0]
    rows = queue_rows(v.order, lambda r: shown(r, v), now)
    return QueuePage(queueing=tenants.load(engine).queueing, rows=rows[page.offset:page.offset + page.limit],
                     total=len(rows))


def stored_queue_page(engine: Engine, page: Page, now: datetime) -> QueuePage:
    """The queue with the reasons the store holds (what ``--data-dir`` and the console show)."""
    queueing, rows = stored_queue(engine, now)
    return QueuePage(queueing=queueing, rows=rows[page.offset:page.offset + page.limit], total=len(rows), judged=False)


def serving_view(engine: Engine, ask: ServingAsk, live_s: float = serving.LIVE_S) -> ServingView:
    """The live gateways, what they have in flight on each instance ``ask`` names (those with
    none are left out), and the store's reason of each of them that is PENDING."""
    since = utcnow() - timedelta(seconds=live_s)
    names = list(dict.fromkeys(ask.instances))
    with Session(engine) as s:
        gateways = [g.url for g in s.exec(select(serving.GatewayRow).where(serving.GatewayRow.updated_at >= since)
                                          .order_by(serving.GatewayRow.id))]
        flying = serving.in_flight_of(s, names, since)
        reasons = s.exec(select(InstanceRow.name, InstanceRow.reason)
                         .where(InstanceRow.name.in_(names), InstanceRow.state == "pending")).all() if names else []
    return ServingView(gateways=gateways, in_flight=flying,
                       reasons={n: r for n, r in reasons if r})


def audit(engine: Engine, ask: AuditAsk, policy: PolicyConfig | None) -> AuditView:
    """A kept decision replayed with this worker's build (and, ``with_settings``, its weights:
    ``policy``), compared with the store's copy of its record; or a deployment's kept decisions."""
    if ask.history:
        return AuditView(rows=decision_replay.history(engine, ask.name, ask.limit))
    return AuditView(replay=decision_replay.replay(engine, ask.name, None, ask.decision or None,
                                                   callers_policy(ask) if ask.with_settings else None))


def callers_policy(ask: AuditAsk) -> PolicyConfig:
    """The settings ``--with-settings`` replays with: the caller's, sent with the ask. An ask
    without them (a gpuflow before this one) is refused: this worker's own settings are not the
    caller's, and a replay with them answered "same decision" whatever the caller had set."""
    if ask.policy is None:
        raise InvalidInput("--with-settings replays with the caller's scheduler settings, and this ask carries none "
                           "(a gpuflow CLI older than this control plane): upgrade the CLI, or replay offline with "
                           "--data-dir/--database-url")
    try:
        return PolicyConfig.model_validate(ask.policy)
    except ValueError as e:
        raise InvalidInput(f"--with-settings: the caller's scheduler settings do not validate: {e}") from None



def claims_page(engine: Engine, ask: ClaimsAsk, settings: ClaimSettings) -> ClaimsView:
    view = claims_view.claims(engine, settings, time.time())
    total = len(view["claims"])
    return ClaimsView(view={**view, "claims": view["claims"][:ask.limit]}, total=total)

class StoreReads:
    """The six reads as this control-plane worker answers them (workflows/cluster_reads.py
    ``Reader``): each in ``pool``, given READ_S. ``reads``: the read-only engine (db.reader);
    ``engine``: the writer, for the queue, whose verdicts are recorded (the one reason);
    ``request_of``: the requests this worker costed, so a verdict knows what the decisions knew."""

    def __init__(self, engine: Engine, reads: Engine, pool: Executor, request_of: RequestOf, policy: PolicyConfig,
                 cluster: Limits | None = None, claims: ClaimSettings | None = None):
        """``cluster``: this worker's limits and, from ``gpuflow server``, its timings (ClusterPolicy)."""
        self.engine, self.reads, self.pool, self.request_of, self.policy = engine, reads, pool, request_of, policy
        self.cluster = cluster or Limits()
        self.claim_settings = claims or ClaimSettings()  # the learned claims' (GPUFLOW_CLAIMS__*)

    def _run(self, what: str, fn, *args, within: float = READ_S):
        try:
            return self.pool.submit(fn, *args).result(timeout=within)
        except Late:
            raise InvalidInput(f"the control plane's store did not answer the {what} read within {READ_S:g} s "
                               "(a busy worker, or a slow database): ask again") from None

    def keys(self, page: Page) -> KeysPage:
        return self._run("keys", keys_page, self.reads, page)

    def key_usage(self, page: Page) -> UsagePage:
        return self._run("key usage", key_usage_page, self.reads, page, datetime.now(timezone.utc))

    def tenants(self, page: Page) -> TenantsPage:
        return self._run("tenants", tenants_page, self.reads, page)

    def queue(self, page: Page) -> QueuePage:
        """The queue judged now, its verdicts recorded (the one reason); past JUDGE_S (a long queue,
        a busy worker) the reasons as the store holds them, while the judgement goes on to record its own."""
        now = datetime.now(timezone.utc)
        judged = self.pool.submit(queue_page, self.engine, page, self.request_of, self.policy, now)
        try:
            return judged.result(timeout=JUDGE_S)
        except Late:
            return self._run("queue", stored_queue_page, self.reads, page, now, within=READ_S - JUDGE_S)

    def serving(self, ask: ServingAsk) -> ServingView:
        return self._run("serving", serving_view, self.reads, ask)

    def settings(self, ask: SettingsAsk) -> SettingsView:
        c = self.cluster
        timings = c.timings if isinstance(c, ClusterPolicy) else None
        return SettingsView(timings=None if timings is None else timings.model_dump(), per_deployment=list(PER_DEPLOYMENT),
                            limits=Limits.model_validate(c.model_dump(exclude={"timings"})).model_dump(),
                            worker=f"{socket.gethostname()}-{os.getpid()}")

    def claims(self, ask: ClaimsAsk) -> ClaimsView:
        """The learned claims (views/claims.py), judged by this worker's GPUFLOW_CLAIMS__* settings."""
        return self._run("claims", claims_page, self.reads, ask, self.claim_settings)

    def audit(self, ask: AuditAsk) -> AuditView:
        return self._run("audit", audit, self.reads, ask, self.policy)

    def bookings(self, ask: BookingsAsk) -> HostBookings:
        """The orphan check's read: which of ``ask.instances`` the ledger books on ``ask.worker``."""
        return self._run("bookings", bookings.host_bookings, self.reads, ask.instances, ask.worker)
