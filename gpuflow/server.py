"""``gpuflow server``: a control-plane worker on ``gpuflow-control`` (the workflows and the
control activities). Run as many as you like against one Temporal namespace and one store."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from datetime import timedelta

from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import PollerBehaviorSimpleMaximum, UnsandboxedWorkflowRunner, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.worker_set import control_activities
from contracts.control import CONTROL_QUEUE
from contracts.limits import ClusterPolicy
from store import db
from activities.metrics import ControlMetrics
from gpuflow.metrics_http import parse_address, sdk_runtime, serve
from gpuflow.runtime import connect, ensure_search_attributes
from gpuflow.settings import Settings
from workflows.autoscaler import AutoscalerWorkflow
from workflows.cluster import ClusterWorkflow
from workflows.cluster_reads import ClusterReadsWorkflow, answer_reads
from workflows.deployment import ModelDeploymentWorkflow
from workflows.host import HostWorkflow
from workflows.instance import ModelInstanceWorkflow
from workflows.queue_sweep import SWEEP_ID, QueueSweepWorkflow

log = logging.getLogger("gpuflow.server")
WORKFLOWS = [ModelDeploymentWorkflow, ModelInstanceWorkflow, HostWorkflow, AutoscalerWorkflow, QueueSweepWorkflow,
             ClusterWorkflow, ClusterReadsWorkflow]
# The sandbox re-imports every module a workflow imports (and that is not passed through) for each
# new workflow run: at a burst that was a third of this process's CPU, most of it compiling
# gpuflow's workflow modules again. They hold no state between runs and make no calls the sandbox
# forbids, so they are passed through like the standard library; the sandbox's runtime checks still
# apply, and the tests replay recorded histories under the full sandbox (tests/test_replay_corpus.py).
RUNNER = SandboxedWorkflowRunner(restrictions=SandboxRestrictions.default.with_passthrough_modules("workflows"))
# Even so, every call the SDK makes into a sandboxed run goes through the sandbox's import and
# builtins guards, and it makes several per payload (its serialization context, for each command):
# at a burst of placements that was a fifth of this process's CPU. By default the control plane
# runs its workflows without the sandbox (Settings.workflow_sandbox turns it back on). The sandbox
# is a determinism check, not a security boundary, and the check is kept where it catches a
# mistake before it ships: the tests replay the histories of real runs under the full sandbox
# (the corpus in tests/test_replay_corpus.py; the live tests' own, as in tests/test_control_plane.py
# and tests/test_tenants_live.py), and tests/test_layout.py keeps the
# workflow modules from importing anything that does I/O.

# The control-plane worker's task slots (issue 37). A replica's first workflow task holds its slot
# while its place_replica local activity waits for its batch (activities/place_batch.py), and its
# second while RUNNING is written in the rows' group commit. With 64 slots a burst's first tasks
# waited 4.3-5.8 s (p50) on the server for a slot, against 1.9-2.5 s with these (bench_fleet's
# steps, from the histories' event times), and placed fewer replicas a second. 256 workflow task
# slots, as many local activity slots (the SDK's default is 100), and 20 workflow task polls (the
# SDK gives a fifth of them to the queue that new workflows' first tasks arrive on: 4 where its
# default gives 1) measured, in three alternating pairs of `bench/bench_fleet.py --hosts 100
# --bursts 500 --modes burst,cli`, 0.60-0.64 of the one-activity ceiling against 0.55-0.60 from
# the SDK, and 0.53-0.56 against 0.41-0.49 from `gpuflow deploy` processes. A slot costs memory
# only while its task is in hand.
WORKFLOW_TASK_SLOTS = 256
LOCAL_ACTIVITY_SLOTS = 256
WORKFLOW_TASK_POLLS = 20


async def start_sweep(client) -> None:
    """The PENDING queue's periodic sweep (workflows/queue_sweep.py): one per cluster, so a
    server that finds it running keeps it."""
    await client.start_workflow(QueueSweepWorkflow.run, id=SWEEP_ID, task_queue=CONTROL_QUEUE,
                                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                                static_summary="the PENDING queue's periodic sweep")


async def start_cluster(client) -> None:
    """The cluster workflow (workflows/cluster.py), the door every configuration change goes
    through, and the reads workflow (workflows/cluster_reads.py), whose queries read the store: one
    of each per cluster; a server that finds them running keeps them."""
    from gpuflow.cluster_client import start, start_reads

    await start(client)
    await start_reads(client)


def until_signalled() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(s, stop.set)
    return stop


async def run_server(settings: Settings, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None,
                     metrics_address: str = "127.0.0.1:9400") -> None:
    engine = db.make_engine(settings.store_url(), schema=settings.database_schema)
    db.init_db(engine)
    addr = parse_address(metrics_address)
    runtime, sdk_addr = sdk_runtime() if addr else (None, None)
    client = await connect(settings.temporal, wait_s=30, runtime=runtime)
    await ensure_search_attributes(client)
    metrics = ControlMetrics(engine)
    acts = control_activities(engine, client, settings.scheduler, metrics=metrics,
                              hub_cache=os.path.join(settings.data_dir, "hub-cache"), hf_endpoint=settings.hf_endpoint,
                              limits=ClusterPolicy(**settings.limits.model_dump(), timings=settings.timings),
                              pending_recheck_s=settings.timings.pending_recheck_s,
                              capacity_hook=settings.capacity_hook, keep_days=settings.decision_retention_days,
                              claims=settings.claims)
    answer_reads(CONTROL_QUEUE, acts.cluster_reads)  # the reads workflow's queries, from this worker's store
    httpd = serve(addr, metrics.registry, sdk_addr) if addr else None
    stop = stop or until_signalled()
    runner = RUNNER if settings.workflow_sandbox else UnsandboxedWorkflowRunner()
    async with Worker(client, task_queue=CONTROL_QUEUE, workflows=WORKFLOWS, workflow_runner=runner,
                      activities=acts.all(),
                      max_concurrent_activities=64, max_concurrent_workflow_tasks=WORKFLOW_TASK_SLOTS,
                      max_concurrent_local_activities=LOCAL_ACTIVITY_SLOTS,
                      workflow_task_poller_behavior=PollerBehaviorSimpleMaximum(WORKFLOW_TASK_POLLS),
                      graceful_shutdown_timeout=timedelta(seconds=5)):
        log.info("control plane serving %s on %s (store %s)", CONTROL_QUEUE, settings.temporal.address,
                 engine.url.render_as_string(hide_password=True))
        print(f"gpuflow server: serving {CONTROL_QUEUE} at {settings.temporal.address}"
              + (f"; metrics on http://{addr[0]}:{addr[1]}/metrics" if addr else ""), flush=True)
        await start_sweep(client)
        await start_cluster(client)
        if ready:
            ready.set()
        await stop.wait()
    acts.runner.shutdown(wait=False)
    if httpd:
        httpd.shutdown()
    engine.dispose()
