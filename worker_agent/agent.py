"""``gpuflow agent --name HOST``: the host agent. A Temporal worker on ``gpuflow-host-<HOST>``
that says hello to its HostWorkflow with its inventory, then serves watch/launch/supervise/stop.
Processes it started survive an agent restart and are adopted by the next run."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from datetime import timedelta
from typing import Callable

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker

from contracts import ui_text
from contracts.ids import host_id
from contracts.host import CONTROL_QUEUE, HostInput, Timings, host_queue
from worker_agent.activities import HostActivities
from worker_agent.bookings import LedgerBookings
from worker_agent.capabilities import runnable_backends, with_backends
from worker_agent.downloads import HubConfig
from worker_agent.engines import EngineConfig
from worker_agent.inventory import discover, gpu_health
from worker_agent.log_reader import KEEP_LOGS, logs_workflow, open_reader, prune_table_logs
from worker_agent.memory_probe import ClaimShare, MemoryProbe, NvmlProbe
from worker_agent.metrics import AgentMetrics, engine_metrics_proxy
from worker_agent.model_header import ModelHeaders
from worker_agent.processes import ProcessTable
from worker_agent.reconcile import stop_orphans
from worker_agent.usage import UsageBook

# The SDK sends an activity's heartbeats at most once per min(0.8 x its heartbeat timeout, this
# cap), and the cap is 60 s by default: a supervisor, whose timeout is long (supervise_heartbeat_s,
# a fallback), still sent one a minute. Lifted, its heartbeats (each a write on the Temporal server)
# follow its timeout. Activities with short timeouts (watch_host, launch) are throttled as before.
HEARTBEAT_THROTTLE_CAP = timedelta(hours=1)


def advertised_address(temporal_address: str) -> str:
    """The local address that routes to the Temporal server: the one other hosts of the cluster
    most likely reach this host on (no packet is sent: a UDP socket is only connected)."""
    host = temporal_address.rsplit(":", 1)[0].strip("[]") or "127.0.0.1"
    try:  # IPv4 first: host:port lists (llama.cpp's --rpc) take it as written
        info = socket.getaddrinfo(host, 1, socket.AF_INET, socket.SOCK_DGRAM)[0]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(info[4])
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


async def say_hello(client: Client, name: str, report, timings: Timings) -> None:
    await client.start_workflow(
        "HostWorkflow", HostInput(name=name, timings=timings), id=host_id(name), task_queue=CONTROL_QUEUE,
        start_signal="hello", start_signal_args=[report], id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        static_summary=f"liveness of host {name}", static_details=ui_text.host_details(report))


async def reap_orphans(client: Client, name: str, table: ProcessTable, stop_grace_s: float = 10.0,
                       counter=None) -> list[str]:
    """Processes this agent started whose instance is gone or no longer placed here: stop them,
    so no orphan holds GPU memory (reconcile.py). Instances still placed here are left for their
    workflow to adopt."""
    return [o.key for o in await stop_orphans(client, name, table, stop_grace_s, counter)]


async def reconcile_every(client: Client, name: str, table: ProcessTable, interval_s: float, counter=None,
                          keep_logs: int = KEEP_LOGS) -> None:
    """The orphan check, every ``interval_s`` while the agent serves, then the logs beyond
    ``keep_logs`` ended instances are dropped; a failed round is logged and the next one tried."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await reap_orphans(client, name, table, counter=counter)
            prune_table_logs(table, keep_logs)
        except Exception as e:  # noqa: BLE001  the server away, say: the next round tries again
            print(f"gpuflow agent {name}: orphan check failed: {type(e).__name__}: {e}", flush=True)


async def sample_every(book: UsageBook, table: ProcessTable, interval_s: float, name: str = "") -> None:
    """Measure every replica's memory each ``interval_s`` (liveness_s) while the agent serves; a
    failed round is logged and the next one tried."""
    while True:
        try:
            await asyncio.to_thread(book.sample, table.records())
        except Exception as e:  # noqa: BLE001  a driver hiccup: the next round tries again
            print(f"gpuflow agent {name}: memory sample failed: {type(e).__name__}: {e}", flush=True)
        await asyncio.sleep(interval_s)


def usage_book(timings: Timings, inventory_file: str | None, probe: MemoryProbe | None) -> UsageBook | None:
    """The agent's book of measured memory (None when liveness_s is 0: nothing is sampled). A host
    of simulated GPUs has no driver to ask: its VRAM use is the claim times 0.9 (memory_probe.py)."""
    if timings.liveness_s <= 0:
        return None
    return UsageBook(probe or (ClaimShare() if inventory_file else NvmlProbe()))


async def run_agent(client: Client, name: str, data_dir: str, timings: Timings, inventory_file: str | None = None,
                    labels: dict[str, str] | None = None, stop: asyncio.Event | None = None,
                    max_instances: int = 64, engines: EngineConfig | None = None,
                    serve_metrics: Callable | None = None, address: str = "127.0.0.1",
                    hub: HubConfig | None = None, table: ProcessTable | None = None,
                    serving: Callable[[str], None] | None = None, memory_probe: MemoryProbe | None = None,
                    keep_logs: int = KEEP_LOGS) -> None:
    """Serve this host. With ``serve_metrics(registry, extra)`` (the CLI's HTTP endpoint), the
    agent's registry is served, and ``extra`` answers /instances/<name>/metrics with each engine's.
    ``serving`` is told the line that says the agent serves (default: printed). ``memory_probe``
    measures each replica's memory every liveness_s (default: NVML, or the claim's share on
    simulated GPUs)."""
    from scheduler.naming import check_name, path_in

    table = table or ProcessTable(path_in(os.path.join(data_dir, "agent"), check_name("worker", name)))
    # the engine probes start other interpreters (a second or so): meanwhile this agent starts serving,
    # so a process of its previous run is adopted without waiting; the first report waits for them
    finding = asyncio.ensure_future(asyncio.to_thread(runnable_backends, engines or EngineConfig()))
    runnable: list[str] = []

    boot = uuid.uuid4().hex[:16]  # this run's id: the control plane tells a restart from an inventory change

    def probe():
        return with_backends(discover(name, inventory_file, labels, owner=table.owner), runnable).model_copy(
            update={"boot": boot})
    probe()  # a bad inventory file fails here, before anything is registered
    book = usage_book(timings, inventory_file, memory_probe)
    metrics = None
    if serve_metrics:
        health = (lambda: {}) if inventory_file else gpu_health  # simulated GPUs have no sensors
        metrics = AgentMetrics(name, probe, table, health=health, usage=book)
        serve_metrics(metrics.registry, engine_metrics_proxy(table, address))
    counter = metrics.orphans if metrics else None
    await reap_orphans(client, name, table, counter=counter)
    prune_table_logs(table, keep_logs)  # the logs of the last keep_logs instances that ended here stay
    hub = hub or HubConfig(cache_dir=os.path.join(data_dir, "models"))
    acts = HostActivities(name, table, probe, bookings=LedgerBookings(client, name), engines=engines, metrics=metrics,
                          address=address, hub=hub, usage=book)
    headers = ModelHeaders(name, acts.engines.model_roots)
    async with Worker(client, task_queue=host_queue(name), activities=acts.all() + [headers.read_model_header],
                      workflows=[logs_workflow(host_queue(name), table.log_dir)],
                      max_concurrent_activities=2 * max_instances + 8,
                      max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE_CAP,
                      graceful_shutdown_timeout=timedelta(seconds=2)):
        runnable.extend(await finding)
        report = probe()
        await say_hello(client, name, report, timings)
        await open_reader(client, name, host_queue(name))
        kind = "simulated GPUs from " + inventory_file if report.simulated else f"{len(report.gpus)} NVML GPU(s)"
        engines_found = ", ".join(report.backends or []) or "none"
        (serving or (lambda line: print(line, flush=True)))(
            f"gpuflow agent {name}: serving {host_queue(name)} ({kind}; engines: {engines_found})")
        check = asyncio.create_task(reconcile_every(client, name, table, timings.orphan_check_s, counter,
                                                    keep_logs))
        sampler = asyncio.create_task(sample_every(book, table, timings.liveness_s, name)) if book else None
        try:
            await (stop or asyncio.Event()).wait()
        finally:
            check.cancel()
            if sampler is not None:
                sampler.cancel()
