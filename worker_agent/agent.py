"""``gpuflow agent --name HOST``: the host agent. A Temporal worker on ``gpuflow-host-<HOST>``
that says hello to its HostWorkflow with its inventory, then serves watch/launch/supervise/stop.
Processes it started survive an agent restart and are adopted by the next run.

Every report it makes is signed with the host's own credential (worker_agent/credential.py), made
at its first start from the cluster's join token. It says hello before it polls its queue and waits
a moment for the verdict: an agent whose hello is refused for good (another agent holds the host's
name, or its join token is not this cluster's) exits saying why, having taken none of the host's
tasks."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from datetime import timedelta
from typing import Callable

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker

from contracts import ui_text
from contracts.control import HostView
from contracts.control_run import NotControlPlane, control_run
from contracts.ids import HOST_WORKFLOW, host_id
from contracts.host import CONTROL_QUEUE, HostInput, HostReport, Timings, host_kind, host_queue
from contracts.host_auth import Refusal
from scheduler.errors import InvalidInput
from worker_agent.credential import HostCredential, open_credential
from worker_agent.activities import HostActivities
from worker_agent.bookings import LedgerBookings
from worker_agent.capabilities import host_engines, path_commands, with_capabilities
from worker_agent.downloads import HubConfig
from worker_agent.engines import EngineConfig
from worker_agent import sim_oom
from worker_agent.inventory import discover, free_for_gpuflow, gpu_health
from worker_agent.log_reader import KEEP_LOGS, logs_workflow, open_reader, prune_table_logs
from worker_agent.memory_probe import ClaimShare, MemoryProbe, NvmlProbe
from worker_agent.metrics import AgentMetrics, engine_metrics_proxy
from worker_agent.model_header import ModelHeaders
from worker_agent.processes import ProcessTable
from worker_agent.reconcile import stop_orphans
from worker_agent.usage import UsageBook

# The SDK sends an activity's heartbeats at most once per min(0.8 x its heartbeat timeout, this
# cap), and the cap is 60 s by default. Lifted, an activity with a long heartbeat timeout (a
# supervisor had one, before the agent supervised its processes itself) heartbeats at its timeout's
# pace. Activities with short timeouts (watch_host, launch) are throttled as before.
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


HELLO_WAIT_S = 10.0  # how long the agent waits for its hello's verdict before it polls its queue anyway
FATAL = ("other_credential", "not_joined")  # refusals no retry can change: the agent exits
NEWS_SAMPLES = 3  # usage news that is not urgent waits this many samples (liveness_s each) for the watch: usage.py


def agent_folder(data_dir: str, name: str) -> str:
    """Where host ``name``'s agent keeps its processes' table, logs and credential."""
    from scheduler.naming import check_name, path_in

    return path_in(os.path.join(data_dir, "agent"), check_name("worker", name))


async def say_hello(client: Client, name: str, report: HostReport, timings: Timings,
                    credential: HostCredential | None = None) -> None:
    """Signal-with-start ``hello`` with ``report``, signed with ``credential`` and stamped with this
    host's clock (ms): the host workflow refuses a stamp no later than the last it took."""
    body = report.model_dump(mode="json", exclude={"auth"})
    signed = credential.signed(body, "hello", str(int(time.time() * 1000))) if credential else body
    await client.start_workflow(
        HOST_WORKFLOW, HostInput(name=name, timings=timings), id=host_id(name), task_queue=CONTROL_QUEUE,
        start_signal="hello", start_signal_args=[signed], id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        static_summary=f"liveness of host {name}", static_details=ui_text.host_details(report))


async def hello_verdict(client: Client, name: str, boot: str, every_s: float = 0.3, most_s: float = 15.0
                        ) -> Refusal | None:
    """None once the host workflow took this agent run's hello (its report names ``boot``); the
    refusal when it refused it. Asks its status query until one or the other, every ``every_s``
    at first, then less often (at most every ``most_s``): a control plane away is not asked 3 times
    a second by every agent. Asked only of a run that is the control plane's HostWorkflow
    (contracts/control_run.py): a workflow of somebody else's holding the id is named once, never
    believed (its refusal would stop this agent)."""
    named = False
    while True:
        try:
            h = await control_run(client, host_id(name), HOST_WORKFLOW, timedelta(seconds=5))
            view = await h.query("status", result_type=HostView, rpc_timeout=timedelta(seconds=5))
        except NotControlPlane as e:
            if not named:
                print(f"gpuflow agent {name}: its hello's verdict not asked: {e}", flush=True)
                named = True
            view = None
        except Exception:  # noqa: BLE001  not started yet, its first task not done, the server away
            view = None
        if view is not None and view.report is not None and view.report.boot == boot:
            return None
        if view is not None and view.refusal is not None and view.refusal.boot == boot:
            return view.refusal
        await asyncio.sleep(every_s)
        every_s = min(every_s * 1.5, most_s)


def _verdict(name: str, task: asyncio.Future) -> None:
    """Raise when ``task`` (hello_verdict) is done with a refusal no retry changes; print any other."""
    if not task.done() or task.cancelled():
        return
    refusal = task.result()
    if refusal is not None and refusal.kind in FATAL:
        raise InvalidInput(f"gpuflow agent {name}: the control plane refused this agent: {refusal.why}")
    if refusal is not None:
        print(f"gpuflow agent {name}: the control plane refused its hello ({refusal.why}); it answers the "
              "host's probe instead", flush=True)


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


async def sample_every(book: UsageBook, table: ProcessTable, interval_s: float, name: str = "",
                       gpus: Callable[[], list] | None = None) -> None:
    """Measure every replica's memory each ``interval_s`` (liveness_s) while the agent serves; a
    failed round is logged and the next one tried. ``gpus``: a simulated host's GPUs (its
    inventory): a replica whose simulated use passes what its GPU has free is killed as an OOM
    would (sim_oom.py)."""
    while True:
        try:
            await asyncio.to_thread(book.sample, table.records(), book.seq)  # the watches as the table is listed
            if gpus is not None:
                simulate_oom(book, table, gpus(), name)
        except Exception as e:  # noqa: BLE001  a driver hiccup: the next round tries again
            print(f"gpuflow agent {name}: memory sample failed: {type(e).__name__}: {e}", flush=True)
        await asyncio.sleep(interval_s)


def simulate_oom(book: UsageBook, table: ProcessTable, gpus: list, name: str = "") -> list[str]:
    """Kill (as an engine's OOM would) each simulated replica whose use passes its GPU's free
    memory; the keys killed."""
    free = {g.index: free_for_gpuflow(g) for g in gpus}
    foreign = {g.index: g.vram_foreign or 0 for g in gpus}
    out = []
    for key, why in book.out_of_memory(free, foreign).items():
        rec = table.find(key)
        if rec is not None and table.returncode(rec.pid) is None:
            print(f"gpuflow agent {name}: {key}: {why}", flush=True)
            sim_oom.kill(table, key, rec.pid, why)
            out.append(key)
    return out


def usage_book(timings: Timings, inventory_file: str | None, probe: MemoryProbe | None) -> UsageBook | None:
    """The agent's book of measured memory (None when liveness_s is 0: nothing is sampled). A host
    of simulated GPUs has no driver to ask: its VRAM use is the claim times 0.9 (memory_probe.py).
    News that is not urgent waits three samples for the watch (usage.py)."""
    if timings.liveness_s <= 0:
        return None
    return UsageBook(probe or (ClaimShare() if inventory_file else NvmlProbe()),
                     settle_s=NEWS_SAMPLES * timings.liveness_s)


async def run_agent(client: Client, name: str, data_dir: str, timings: Timings, inventory_file: str | None = None,
                    labels: dict[str, str] | None = None, stop: asyncio.Event | None = None,
                    max_instances: int = 64, engines: EngineConfig | None = None,
                    serve_metrics: Callable | None = None, address: str = "127.0.0.1",
                    hub: HubConfig | None = None, table: ProcessTable | None = None,
                    serving: Callable[[str], None] | None = None, memory_probe: MemoryProbe | None = None,
                    keep_logs: int = KEEP_LOGS, credential: HostCredential | None = None,
                    join_token: str | None = None, kv_connectors: list[str] | None = None) -> None:
    """Serve this host. With ``serve_metrics(registry, extra)`` (the CLI's HTTP endpoint), the
    agent's registry is served, and ``extra`` answers /instances/<name>/metrics with each engine's.
    ``serving`` is told the line that says the agent serves (default: printed). ``memory_probe``
    measures each replica's memory every liveness_s (default: NVML, or the claim's share on
    simulated GPUs). ``credential``: the host's (default: the one in the process table's folder,
    made from ``join_token`` at the first start; worker_agent/credential.py). ``kv_connectors``: the
    KV connectors the operator states this host's engines run (default: found; kv_connectors.py)."""
    table = table or ProcessTable(agent_folder(data_dir, name))
    own = credential is None
    credential = credential or open_credential(os.path.dirname(table.run_dir), name, join_token)
    try:
        await _serve(client, name, data_dir, timings, inventory_file, labels, stop, max_instances, engines,
                     serve_metrics, address, hub, table, serving, memory_probe, keep_logs, credential, kv_connectors)
    finally:
        if own:
            credential.close()


async def _serve(client: Client, name: str, data_dir: str, timings: Timings, inventory_file: str | None,
                 labels: dict[str, str] | None, stop: asyncio.Event | None, max_instances: int,
                 engines: EngineConfig | None, serve_metrics: Callable | None, address: str, hub: HubConfig | None,
                 table: ProcessTable, serving: Callable[[str], None] | None, memory_probe: MemoryProbe | None,
                 keep_logs: int, credential: HostCredential, kv_stated: list[str] | None) -> None:
    runs = table.runs  # real processes, or nothing (gpuflow simulate's table)
    # the engine probes start other interpreters (a second or so), while the orphans are reaped
    finding = asyncio.ensure_future(asyncio.to_thread(host_engines, engines or EngineConfig(), runs))
    runnable: list[str] = []
    kv_found: list[list[str] | None] = [None]
    commands = await asyncio.to_thread(path_commands, os.environ.get("PATH")) if runs == "processes" else None

    boot = uuid.uuid4().hex[:16]  # this run's id: the control plane tells a restart from an inventory change

    def probe():
        return with_capabilities(discover(name, inventory_file, labels, owner=table.owner), runnable, runs,
                                 commands, kv_stated, kv_found[0]).model_copy(update={"boot": boot})
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
                          address=address, hub=hub, usage=book, credential=credential)
    headers = ModelHeaders(name, acts.engines.model_roots)
    found_engines, kv_found[0] = await finding
    runnable.extend(found_engines)
    report = probe()
    # hello first, and a moment for its verdict, before this agent polls the host's queue: one refused
    # for good (a second agent with a live host's name) leaves without taking a task of the first's
    await say_hello(client, name, report, timings, credential)
    verdict = asyncio.ensure_future(hello_verdict(client, name, boot))
    stopping = asyncio.ensure_future((stop or asyncio.Event()).wait())
    # a stop (SIGTERM) ends the wait too: with the control plane away, the verdict takes HELLO_WAIT_S
    await asyncio.wait({verdict, stopping}, timeout=HELLO_WAIT_S, return_when=asyncio.FIRST_COMPLETED)
    if stopping.done():  # stopped before it polled its queue: nothing of the host's to hand back
        verdict.cancel()
        return
    try:
        _verdict(name, verdict)
    except BaseException:
        stopping.cancel()
        raise
    async with Worker(client, task_queue=host_queue(name), activities=acts.all() + [headers.read_model_header],
                      workflows=[logs_workflow(host_queue(name), table.log_dir)],
                      max_concurrent_activities=2 * max_instances + 8,
                      max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE_CAP,
                      graceful_shutdown_timeout=timedelta(seconds=2)):
        await open_reader(client, name, host_queue(name))
        kind = (f"{host_kind(report.simulated, report.runs)} host: " +
                ("GPUs from " + inventory_file if report.simulated else f"{len(report.gpus)} NVML GPU(s)"))
        engines_found = ", ".join(report.backends or []) or "none"
        kv = "" if report.kv_connectors is None else f"; KV connectors: {', '.join(report.kv_connectors) or 'none'}"
        (serving or (lambda line: print(line, flush=True)))(
            f"gpuflow agent {name}: serving {host_queue(name)} ({kind}; engines: {engines_found}{kv})")
        check = asyncio.create_task(reconcile_every(client, name, table, timings.orphan_check_s, counter,
                                                    keep_logs))
        sim_gpus = (lambda: probe().gpus) if book and isinstance(book.probe, ClaimShare) else None  # OOMs simulated
        sampler = asyncio.create_task(sample_every(book, table, timings.liveness_s, name, sim_gpus)) if book else None
        try:
            if not verdict.done():  # no verdict yet (the control plane is away, say): one that comes later counts
                await asyncio.wait({stopping, verdict}, return_when=asyncio.FIRST_COMPLETED)
                _verdict(name, verdict)
            await stopping
        finally:
            acts.supervision.close()  # its processes stay: the next agent run adopts them
            for task in (check, sampler, stopping, verdict):
                if task is not None:
                    task.cancel()
