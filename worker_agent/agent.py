"""``gpuflow agent --name HOST``: the host agent. A Temporal worker on ``gpuflow-host-<HOST>``
that says hello to its HostWorkflow with its inventory, then serves watch/launch/supervise/stop.
Processes it started survive an agent restart and are adopted by the next run."""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from functools import partial
from typing import Callable

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker

from activities.payloads import CONTROL_QUEUE, HostInput, Timings, host_queue
from worker_agent.activities import HostActivities
from worker_agent.engines import EngineConfig
from worker_agent.inventory import discover, gpu_health
from worker_agent.metrics import AgentMetrics, engine_metrics_proxy
from worker_agent.processes import ProcessTable


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
        try:
            handle = client.get_workflow_handle(f"instance/{rec.instance}")
            desc = await handle.describe()
            here = desc.status is not None and desc.status.name == "RUNNING" and \
                (await handle.query("status")).get("worker") == name
        except RPCError:
            here = False
        if not here:
            await table.stop(rec.instance, stop_grace_s)
            reaped.append(rec.instance)
    return reaped


async def run_agent(client: Client, name: str, data_dir: str, timings: Timings, inventory_file: str | None = None,
                    labels: dict[str, str] | None = None, stop: asyncio.Event | None = None,
                    max_instances: int = 64, engines: EngineConfig | None = None,
                    serve_metrics: Callable | None = None) -> None:
    """Serve this host. With ``serve_metrics(registry, extra)`` (the CLI's HTTP endpoint), the
    agent's registry is served, and ``extra`` answers /instances/<name>/metrics with each engine's."""
    table = ProcessTable(os.path.join(data_dir, "agent", name))
    probe = partial(discover, name, inventory_file, labels, ours=table.owns)
    report = probe()  # a bad inventory file fails here, before anything is registered
    metrics = None
    if serve_metrics:
        health = (lambda: {}) if inventory_file else gpu_health  # simulated GPUs have no sensors
        metrics = AgentMetrics(name, probe, table, health=health)
        serve_metrics(metrics.registry, engine_metrics_proxy(table))
    for n in await reap_orphans(client, name, table):
        print(f"gpuflow agent {name}: stopped {n}: its instance is no longer placed on this host", flush=True)
    acts = HostActivities(name, table, probe, engines=engines, metrics=metrics)
    async with Worker(client, task_queue=host_queue(name), activities=acts.all(),
                      max_concurrent_activities=2 * max_instances + 8,
                      graceful_shutdown_timeout=timedelta(seconds=2)):
        await say_hello(client, name, report, timings)
        kind = "simulated GPUs from " + inventory_file if report.simulated else f"{len(report.gpus)} NVML GPU(s)"
        print(f"gpuflow agent {name}: serving {host_queue(name)} ({kind})", flush=True)
        await (stop or asyncio.Event()).wait()
