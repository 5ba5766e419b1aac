"""ClusterReadsWorkflow (id ``cluster-reads``): the cluster's reads, answered as queries.

``gpuflow keys list`` and ``keys usage``, ``tenants``, ``queue``, what ``status`` adds about
serving and ``explain --replay/--history`` ask one of its queries (``keys``, ``key_usage``,
``tenants``, ``queue``, ``serving``, ``audit``; payloads in contracts/cluster.py), and every
agent's orphan check asks ``bookings`` (contracts/host.py ``BookingsAsk``). A query is
answered by a control-plane worker and recorded in no history: a read adds no event and takes no
workflow task, however often a page is refreshed. So ``--address`` stays all a command needs, and
no client opens the database itself.

The answering worker reads its store through the ``Reader`` it registered for its task queue
(``answer_reads``: gpuflow server registers activities/cluster_reads.py ``StoreReads``), as the
host's log reader reads the host's files (worker_agent/log_reader.py). The query runs on the
worker's workflow thread, so the reader gives each read a deadline below the SDK's 2 s deadlock
limit and answers with an error naming it past that. Not sandboxed: its only work, the queries,
reads the store; its run only waits (deterministic, and its history stays at its start). Why
queries, and not the updates these reads were before or a read model in memory:
docs/architecture.md, "Reads".

Every ``gpuflow server`` starts it at boot, keeping one already running; a client starts it when
it is missing (gpuflow/cluster_client.py). Each query's input is untrusted and checked as the
cluster workflow checks its updates' (``one``)."""

from __future__ import annotations

from typing import Any, Protocol

from temporalio import workflow

from contracts import cluster as cc
from contracts import ids
from contracts.host import BookingsAsk, HostBookings
from workflows import guards
from workflows.cluster import one


class Reader(Protocol):
    """The store's answers to the six reads (activities/cluster_reads.py ``StoreReads``)."""

    def keys(self, page: cc.Page) -> cc.KeysPage: ...

    def key_usage(self, page: cc.Page) -> cc.UsagePage: ...

    def tenants(self, page: cc.Page) -> cc.TenantsPage: ...

    def queue(self, page: cc.Page) -> cc.QueuePage: ...

    def serving(self, ask: cc.ServingAsk) -> cc.ServingView: ...

    def audit(self, ask: cc.AuditAsk) -> cc.AuditView: ...

    def claims(self, ask: cc.ClaimsAsk) -> cc.ClaimsView: ...

    def settings(self, ask: cc.SettingsAsk) -> cc.SettingsView: ...

    def bookings(self, ask: BookingsAsk) -> HostBookings: ...


READERS: dict[str, Reader] = {}  # task queue -> the reader of the control-plane worker polling it, in this process


def answer_reads(queue: str, reader: Reader) -> None:
    """Answer the reads asked on ``queue`` (this process's control-plane worker) with ``reader``."""
    READERS[queue] = reader


def reader() -> Reader:
    got = READERS.get(workflow.info().task_queue)
    if got is None:
        raise RuntimeError(f"this worker on {workflow.info().task_queue} reads no store: start the control plane "
                           "with 'gpuflow server', which answers the cluster's reads")
    return got


@workflow.defn(name=ids.CLUSTER_READS_WORKFLOW, sandboxed=False)
class ClusterReadsWorkflow:
    @workflow.run
    async def run(self, *args: Any) -> None:
        guards.workflow_id(ids.CLUSTER_READS_ID, "kind (the cluster's reads)")
        await workflow.wait_condition(lambda: False)  # answers queries as long as the cluster lives

    @workflow.query(name=ids.CLUSTER_KEYS)
    def keys(self, *args: Any) -> cc.KeysPage:
        return reader().keys(one(args, cc.Page, ids.CLUSTER_KEYS))

    @workflow.query(name=ids.CLUSTER_KEY_USAGE)
    def key_usage(self, *args: Any) -> cc.UsagePage:
        return reader().key_usage(one(args, cc.Page, ids.CLUSTER_KEY_USAGE))

    @workflow.query(name=ids.CLUSTER_TENANTS)
    def tenants(self, *args: Any) -> cc.TenantsPage:
        return reader().tenants(one(args, cc.Page, ids.CLUSTER_TENANTS))

    @workflow.query(name=ids.CLUSTER_QUEUE)
    def queue(self, *args: Any) -> cc.QueuePage:
        """The queue judged afresh, its reasons recorded (the one reason: activities/pending_reasons.py)."""
        return reader().queue(one(args, cc.Page, ids.CLUSTER_QUEUE))

    @workflow.query(name=ids.CLUSTER_SERVING)
    def serving(self, *args: Any) -> cc.ServingView:
        return reader().serving(one(args, cc.ServingAsk, ids.CLUSTER_SERVING))

    @workflow.query(name=ids.CLUSTER_AUDIT)
    def audit(self, *args: Any) -> cc.AuditView:
        """A kept decision replayed with the answering worker's build, or a deployment's kept decisions."""
        return reader().audit(one(args, cc.AuditAsk, ids.CLUSTER_AUDIT))

    @workflow.query(name=ids.CLUSTER_SETTINGS)
    def settings(self, *args: Any) -> cc.SettingsView:
        """The cluster's timings and limits, as the answering worker's settings hold them."""
        return reader().settings(one(args, cc.SettingsAsk, ids.CLUSTER_SETTINGS))

    @workflow.query(name=ids.CLUSTER_BOOKINGS)
    def bookings(self, *args: Any) -> HostBookings:
        """The agents' orphan check (worker_agent/reconcile.py): which of the instances an agent runs
        processes for the ledger books on its host, and their parts. A read of the ledger, as the host
        workflow's ``bookings`` update was, written in no history (that update is the agent's fallback)."""
        return reader().bookings(one(args, BookingsAsk, ids.CLUSTER_BOOKINGS))

    @workflow.query(name=ids.CLUSTER_CLAIMS)
    def claims(self, *args: Any) -> cc.ClaimsView:
        """The learned memory claims (views/claims.py), with the answering worker's settings."""
        return reader().claims(one(args, cc.ClaimsAsk, ids.CLUSTER_CLAIMS))
