"""``gpuflow agent --name HOST``: the host agent. A Temporal worker on ``gpuflow-host-<HOST>``
that says hello to its HostWorkflow with its inventory, then serves watch/launch/supervise/stop.
Processes it started survive an agent restart and are adopted by the next run."""

from __future__ import annotations

import asyncio
import os
import socket
from datetime import timedelta
from functools import partial
from typing import Callable

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker

from activities.payloads import CONTROL_QUEUE, HostInput, Timings, host_queue
from worker_agent.activities import HostActivities
from worker_agent.downloads import HubConfig
from worker_agent.engines import EngineConfig
from worker_agent.inventory import discover, gpu_health
from worker_agent.log_reader import logs_workflow, open_reader
from worker_agent.metrics import AgentMetrics, engine_metrics_proxy
from worker_agent.payloads import instance_of
from worker_agent.processes import ProcessTable


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
        "HostWorkflow", HostInput(name=name, timings=timings), id=f"host/{name}", task_queue=CONTROL_QUEUE,
        start_signal="hello", start_signal_args=[report], id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        static_summary=f"liveness of host {name}")


async def reap_orphans(client: Client, name: str, table: ProcessTable, stop_grace_s: float = 10.0) -> list[str]:
    """Processes a previous run of this agent started whose instance is no longer placed here
    (moved elsewhere while this host was unreachable, or its workflow ended): stop them, so no
    orphan holds GPU memory. Instances still placed here are left for their workflow to adopt."""
    from temporalio.service import RPCError

    reaped = []
    for rec in table.records():
        if not table.alive(rec.pid):
            table.forget(rec.instance)
            continue
        try:  # a helper's key is instance@part: it belongs to the instance's placement too
            handle = client.get_workflow_handle(f"instance/{instance_of(rec.instance)}")
            desc = await handle.describe()
            view = await handle.query("status") if desc.status is not None and desc.status.name == "RUNNING" else {}
            here = name in [view.get("worker"), *view.get("subordinate_workers", [])] if view else False
        except RPCError:
            here = False
        if not here:
            await table.stop(rec.instance, stop_grace_s)
            reaped.append(rec.instance)
    return reaped


async def run_agent(client: Client, name: str, data_dir: str, timings: Timings, inventory_file: str | None = None,
                    labels: dict[str, str] | None = None, stop: asyncio.Event | None = None,
                    max_instances: int = 64, engines: EngineConfig | None = None,
                    serve_metrics: Callable | None = None, address: str = "127.0.0.1",
                    hub: HubConfig | None = None, table: ProcessTable | None = None) -> None:
    """Serve this host. With ``serve_metrics(registry, extra)`` (the CLI's HTTP endpoint), the
    agent's registry is served, and ``extra`` answers /instances/<name>/metrics with each engine's."""
    table = table or ProcessTable(os.path.join(data_dir, "agent", name))  # gpuflow simulate passes its own
    probe = partial(discover, name, inventory_file, labels, owner=table.owner)
    report = probe()  # a bad inventory file fails here, before anything is registered
    metrics = None
    if serve_metrics:
        health = (lambda: {}) if inventory_file else gpu_health  # simulated GPUs have no sensors
        metrics = AgentMetrics(name, probe, table, health=health)
        serve_metrics(metrics.registry, engine_metrics_proxy(table))
    for n in await reap_orphans(client, name, table):
        print(f"gpuflow agent {name}: stopped {n}: its instance is no longer placed on this host", flush=True)
    hub = hub or HubConfig(cache_dir=os.path.join(data_dir, "models"))
    acts = HostActivities(name, table, probe, engines=engines, metrics=metrics, address=address, hub=hub)
    async with Worker(client, task_queue=host_queue(name), activities=acts.all(),
                      workflows=[logs_workflow(host_queue(name), table.log_dir)],
                      max_concurrent_activities=2 * max_instances + 8,
                      graceful_shutdown_timeout=timedelta(seconds=2)):
        await say_hello(client, name, report, timings)
        await open_reader(client, name, host_queue(name))
        kind = "simulated GPUs from " + inventory_file if report.simulated else f"{len(report.gpus)} NVML GPU(s)"
        print(f"gpuflow agent {name}: serving {host_queue(name)} ({kind})", flush=True)
        await (stop or asyncio.Event()).wait()
