"""``gpuflow agent --name HOST``: the host agent. A Temporal worker on ``gpuflow-host-<HOST>``
that says hello to its HostWorkflow with its inventory, then serves watch/launch/supervise/stop.
Processes it started survive an agent restart and are adopted by the next run."""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from functools import partial

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker

from activities.payloads import CONTROL_QUEUE, HostInput, Timings, host_queue
from worker_agent.activities import HostActivities
from worker_agent.inventory import discover
from worker_agent.processes import ProcessTable


async def say_hello(client: Client, name: str, report, timings: Timings) -> None:
    await client.start_workflow(
        "HostWorkflow", HostInput(name=name, timings=timings), id=f"host/{name}", task_queue=CONTROL_QUEUE,
        start_signal="hello", start_signal_args=[report], id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        static_summary=f"liveness of host {name}")


async def run_agent(client: Client, name: str, data_dir: str, timings: Timings, inventory_file: str | None = None,
                    labels: dict[str, str] | None = None, stop: asyncio.Event | None = None,
                    max_instances: int = 64) -> None:
    table = ProcessTable(os.path.join(data_dir, "agent", name))
    probe = partial(discover, name, inventory_file, labels)
    report = probe()  # a bad inventory file fails here, before anything is registered
    acts = HostActivities(name, table, probe)
    async with Worker(client, task_queue=host_queue(name), activities=acts.all(),
                      max_concurrent_activities=2 * max_instances + 8,
                      graceful_shutdown_timeout=timedelta(seconds=2)):
        await say_hello(client, name, report, timings)
        kind = "simulated GPUs from " + inventory_file if report.simulated else f"{len(report.gpus)} NVML GPU(s)"
        print(f"gpuflow agent {name}: serving {host_queue(name)} ({kind})", flush=True)
        await (stop or asyncio.Event()).wait()
