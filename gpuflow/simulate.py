"""``gpuflow simulate``: a fleet of simulated hosts in one process, to rehearse a cluster size.

Each host ``<prefix>-<i>`` is a real agent (worker_agent.agent.run_agent: a Temporal worker on
its own host task queue, the agent's own activities) with a simulated process runner behind the
process seam (worker_agent/sim_processes.py): nothing is forked. Its inventory comes from the
file given, so it reports itself ``simulated``.

``gpuflow simulate --kill HOST`` makes one host of the running simulator vanish, as if it lost
power: its activities stop heartbeating and never answer, its worker stops polling, and its
servers stop answering. (The command appends HOST to DATA_DIR/simulate/kill and sends SIGUSR1 to
the simulator whose pid DATA_DIR/simulate/fleet.json names.) Ctrl-C stops every host cleanly.

Each simulated replica reports a measured memory of its claim times ``--vram-use-ratio`` (default
0.9; above 1 rehearses replicas that outgrow their claims), so ``gpuflow status`` shows VRAM used
against claimed as a real host's NVML figures would (worker_agent/memory_probe.py ClaimShare).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal

from temporalio import client as tclient
from temporalio import worker as tworker

from scheduler.errors import InvalidInput
from worker_agent.sim_processes import SimulatedProcessTable

PREFIX = re.compile(r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$")


class HostState:
    def __init__(self) -> None:
        self.dead = asyncio.Event()
        self.exiting = False  # the simulator is ending: hung activities may end too


class Vanish(tclient.Interceptor, tworker.Interceptor):
    """Per-host interceptor: once the host is dead, its activities hang without heartbeats."""

    def __init__(self, state: HostState) -> None:
        self.state = state

    def intercept_activity(self, next: tworker.ActivityInboundInterceptor) -> tworker.ActivityInboundInterceptor:
        return _Inbound(next, self.state)


class _Outbound(tworker.ActivityOutboundInterceptor):
    def __init__(self, next: tworker.ActivityOutboundInterceptor, state: HostState) -> None:
        super().__init__(next)
        self.state = state

    def heartbeat(self, *details) -> None:
        if not self.state.dead.is_set():
            super().heartbeat(*details)


class _Inbound(tworker.ActivityInboundInterceptor):
    def __init__(self, next: tworker.ActivityInboundInterceptor, state: HostState) -> None:
        super().__init__(next)
        self.state = state

    def init(self, outbound: tworker.ActivityOutboundInterceptor) -> None:
        super().init(_Outbound(outbound, self.state))

    async def execute_activity(self, input: tworker.ExecuteActivityInput):
        if self.state.dead.is_set():
            await self._hang()
        task = asyncio.ensure_future(super().execute_activity(input))
        dead = asyncio.ensure_future(self.state.dead.wait())
        try:
            await asyncio.wait({task, dead}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            dead.cancel()
            raise
        if task.done():
            dead.cancel()
            return task.result()
        task.cancel()  # the host died under it: whatever it was doing is lost, and nothing answers
        try:
            await task
        except BaseException:  # noqa: BLE001
            pass
        await self._hang()

    async def _hang(self) -> None:
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                if self.state.exiting:
                    raise


class SimHost:
    def __init__(self, name: str, data_dir: str, start_delay: float, fail_rate: float, rng: random.Random) -> None:
        self.name = name
        self.state = HostState()
        self.stop = asyncio.Event()
        self.table = SimulatedProcessTable(os.path.join(data_dir, "simulate", name), start_delay, fail_rate, rng)
        self.task: asyncio.Task | None = None

    def vanish(self) -> None:
        self.state.dead.set()
        self.table.vanish()
        self.stop.set()  # the worker stops polling; its shutdown then waits on the hung activities


def _raise_file_limit() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


def fleet_file(data_dir: str) -> str:
    return os.path.join(data_dir, "simulate", "fleet.json")


def check_args(hosts: int, prefix: str, start_delay: float, fail_rate: float, vram_use_ratio: float = 0.9) -> None:
    if hosts < 1:
        raise InvalidInput(f"--hosts must be at least 1, got {hosts}")
    if not PREFIX.match(prefix):
        raise InvalidInput(f"--name-prefix {prefix!r}: lowercase letters, digits and '-', at most 42 characters")
    if start_delay < 0:
        raise InvalidInput(f"--start-delay must be >= 0 seconds, got {start_delay:g}")
    if not 0 <= fail_rate <= 1:
        raise InvalidInput(f"--fail-rate is a share between 0 and 1, got {fail_rate:g}")
    if not 0 <= vram_use_ratio <= 4:
        raise InvalidInput(f"--vram-use-ratio is the share of its claim a replica uses, 0 to 4, got {vram_use_ratio:g}")


LEAVE_WAIT_S = 15.0  # on a clean exit, how long the simulator waits for its hosts that can leave at once


async def run_fleet(client: tclient.Client, data_dir: str, timings, inventory: str, hosts: int, prefix: str = "sim",
                    start_delay: float = 0.5, fail_rate: float = 0.0, stop: asyncio.Event | None = None,
                    seed: int | None = None, started: asyncio.Event | None = None, vram_use_ratio: float = 0.9,
                    join_token: str | None = None) -> None:
    """Serve ``hosts`` simulated hosts until ``stop``; SIGUSR1 reads DATA_DIR/simulate/kill. Each host
    joins with ``join_token`` at its first start, and keeps its credential in DATA_DIR/simulate/HOST."""
    from worker_agent.agent import run_agent
    from worker_agent.engines import EngineConfig
    from worker_agent.inventory import discover
    from worker_agent.memory_probe import ClaimShare

    check_args(hosts, prefix, start_delay, fail_rate, vram_use_ratio)
    _raise_file_limit()  # every simulated server is a listening socket of this process
    discover(f"{prefix}-0", inventory)  # a bad inventory file fails here, before any host starts
    rng = random.Random(seed)
    fleet = {f"{prefix}-{i}": SimHost(f"{prefix}-{i}", data_dir, start_delay, fail_rate, rng) for i in range(hosts)}
    os.makedirs(os.path.dirname(fleet_file(data_dir)), exist_ok=True)
    kill_file = os.path.join(os.path.dirname(fleet_file(data_dir)), "kill")
    if os.path.exists(kill_file):
        os.unlink(kill_file)
    up = []

    def serving(line: str) -> None:  # one line for the fleet, not one per host
        up.append(line)
        if len(up) == hosts:
            print(f"gpuflow simulate: all {hosts} hosts serve their task queues and said hello", flush=True)

    for h in fleet.values():
        hc = tclient.Client(client.service_client, namespace=client.namespace, data_converter=client.data_converter,
                            interceptors=[Vanish(h.state)])
        h.task = asyncio.ensure_future(run_agent(
            hc, h.name, data_dir, timings, inventory, {"simulator": prefix}, stop=h.stop, table=h.table,
            serve_metrics=lambda registry, extra: None, address="127.0.0.1",
            engines=EngineConfig(allow_custom=True), serving=serving,  # nothing is executed: argv is only logged
            memory_probe=ClaimShare(vram_use_ratio), join_token=join_token))
    with open(fleet_file(data_dir), "w") as f:
        json.dump({"pid": os.getpid(), "hosts": sorted(fleet)}, f)

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, _vanish_listed, fleet, kill_file)
    print(f"gpuflow simulate: {hosts} simulated hosts {prefix}-0..{prefix}-{hosts - 1} "
          f"(start delay {start_delay:g} s, fail rate {fail_rate:g}); Ctrl-C stops", flush=True)
    if started is not None:
        started.set()
    try:
        waiter = asyncio.ensure_future((stop or asyncio.Event()).wait())
        failed = [t for t in (h.task for h in fleet.values())]
        done, _ = await asyncio.wait({waiter, *failed}, return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            if t is not waiter and not t.cancelled() and t.exception() is not None:
                raise t.exception()
    finally:
        loop.remove_signal_handler(signal.SIGUSR1)
        alive = await _stop_fleet(fleet, data_dir)
        if stop is not None and stop.is_set():  # a clean exit (Ctrl-C, SIGTERM): the hosts leave the cluster
            print(await leave(client, [h.name for h in alive]), flush=True)


def _vanish_listed(fleet: dict, kill_file: str) -> None:
    """SIGUSR1: the hosts named in DATA_DIR/simulate/kill vanish (their processes die with them)."""
    try:
        with open(kill_file) as f:
            names = [n.strip() for n in f if n.strip()]
    except OSError:
        return
    for n in names:
        h = fleet.get(n)
        if h is not None and not h.state.dead.is_set():
            h.vanish()
            print(f"gpuflow simulate: {n} vanished", flush=True)


async def _stop_fleet(fleet: dict, data_dir: str) -> list:
    """Stop every host still alive and say how many; returns them."""
    alive = [h for h in fleet.values() if not h.state.dead.is_set()]
    for h in fleet.values():
        h.state.exiting = True
        h.stop.set()
    await asyncio.gather(*(h.task for h in alive), return_exceptions=True)
    for h in fleet.values():
        if h.task is not None and not h.task.done():
            h.task.cancel()
    try:
        os.unlink(fleet_file(data_dir))
    except OSError:
        pass
    print(f"gpuflow simulate: stopped {len(alive)} host(s)"
          + (f"; {len(fleet) - len(alive)} had vanished" if len(alive) < len(fleet) else ""), flush=True)
    return alive


async def leave(client: tclient.Client, names: list[str], wait_s: float = LEAVE_WAIT_S) -> str:
    """Each host leaves for good (HostWorkflow.leave): forgotten once NOT_READY with no replica left,
    so at once for those that hold none, else once their replicas are placed elsewhere; its logs
    workflow ends (nobody is left to read the logs). They stayed NOT_READY until 'gpuflow hosts
    forget' (issue 36). Waits up to ``wait_s`` for those that can go now; what happened, in a line."""
    from contracts.ids import host_id, host_logs_id
    from gpuflow.ops import bounded

    async def tell(name: str) -> bool:
        try:
            await client.get_workflow_handle(host_id(name)).execute_update("leave")
            await client.get_workflow_handle(host_logs_id(name)).terminate(f"host {name} left")
        except Exception:  # noqa: BLE001  Temporal gone, or the workflow ended: it stays as it was
            return False
        return True

    async def gone(name: str) -> bool:
        try:
            d = await client.get_workflow_handle(host_id(name)).describe()
        except Exception:  # noqa: BLE001
            return False
        return d.status is not None and d.status.name != "RUNNING"

    told = [n for n, ok in zip(names, await bounded([tell(n) for n in names])) if ok]
    deadline, left = asyncio.get_running_loop().time() + wait_s, []
    while True:
        left = [n for n, g in zip(told, await bounded([gone(n) for n in told])) if g]
        if len(left) == len(told) or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.5)
    out = f"gpuflow simulate: {len(left)} host(s) left the cluster"
    if len(told) > len(left):
        out += (f"; {len(told) - len(left)} still hold replicas: each leaves once they are placed elsewhere "
                "(after their unreachable grace, GPUFLOW_TIMINGS__UNREACHABLE_GRACE_S)")
    if len(names) > len(told):
        out += f"; {len(names) - len(told)} could not be told (they stay until 'gpuflow hosts forget')"
    return out

def kill(data_dir: str, host: str) -> None:
    """Tell the running simulator of ``data_dir`` to make ``host`` vanish."""
    try:
        with open(fleet_file(data_dir)) as f:
            fleet = json.load(f)
    except (OSError, ValueError):
        raise InvalidInput(f"no simulator is running with data dir {data_dir} ({fleet_file(data_dir)} is missing)") \
            from None
    if host not in fleet.get("hosts", []):
        raise InvalidInput(f"{host!r} is not a host of the running simulator (pid {fleet.get('pid')})")
    with open(os.path.join(os.path.dirname(fleet_file(data_dir)), "kill"), "a") as f:
        f.write(host + "\n")
    try:
        os.kill(int(fleet["pid"]), signal.SIGUSR1)
    except (ProcessLookupError, ValueError, TypeError):
        raise InvalidInput(f"the simulator (pid {fleet.get('pid')}) is not running any more") from None


def fleet_token(s, path: str | None = None) -> str:
    """The join token the simulated hosts join with: as an agent's (GPUFLOW_AGENT__JOIN_TOKEN, or the
    file ``path`` or the settings name), else read from the store when it is at hand (--database-url,
    or --data-dir's SQLite file: a rehearsal on the control plane's own machine)."""
    from sqlalchemy.exc import SQLAlchemyError

    from gpuflow.serving_view import open_store
    from store import host_credentials
    from worker_agent.credential import read_token

    given = s.agent.join_token.get_secret_value() if s.agent.join_token else None
    token = read_token(given, path or s.agent.join_token_file)
    engine = None if token else open_store(s, False)
    if engine is not None:
        try:
            token = host_credentials.join_token(engine)
        except (SQLAlchemyError, ValueError):  # not a store of ours, or not made yet: said below
            token = None
        finally:
            engine.dispose()
    if not token:
        raise InvalidInput("gpuflow simulate needs the cluster's join token for its hosts: GPUFLOW_AGENT__JOIN_TOKEN "
                           "or --join-token-file FILE ('gpuflow hosts join-token' prints it), or the control plane's "
                           "store to read it from (--database-url URL, or --data-dir DIR of its gpuflow.db)")
    return token


def cmd_simulate(a) -> int:
    from gpuflow.cli.connection import run_command, settings_from
    from gpuflow.runtime import connect
    from gpuflow.server import until_signalled

    s = settings_from(a)
    if a.kill:
        kill(s.data_dir, a.kill)
        print(f"gpuflow simulate: told the simulator to make {a.kill} vanish")
        return 0
    if a.hosts is None or not a.inventory:
        raise InvalidInput("gpuflow simulate needs --hosts N and --inventory FILE (or --kill HOST)")
    check_args(a.hosts, a.name_prefix, a.start_delay, a.fail_rate, a.vram_use_ratio)
    token = fleet_token(s, a.join_token_file)

    async def go():
        client = await connect(s.temporal, wait_s=30)
        await run_fleet(client, s.data_dir, s.timings, a.inventory, a.hosts, a.name_prefix, a.start_delay,
                        a.fail_rate, stop=until_signalled(), seed=a.seed, vram_use_ratio=a.vram_use_ratio,
                        join_token=token)

    return run_command(go())


def add_command(sub) -> None:
    from gpuflow.cli.connection import temporal_flags

    p = sub.add_parser("simulate", help="run N simulated hosts in one process (rehearse a cluster size)")
    temporal_flags(p)
    p.add_argument("--hosts", type=int, help="how many hosts: <prefix>-0 .. <prefix>-(N-1)")
    p.add_argument("--inventory", help="every host's inventory (YAML/JSON, as for 'gpuflow agent --inventory')")
    p.add_argument("--name-prefix", default="sim", help="host names are PREFIX-i (default sim)")
    p.add_argument("--start-delay", type=float, default=0.5, help="seconds until a launched server answers (0.5)")
    p.add_argument("--fail-rate", type=float, default=0.0, help="share of launches that fail (0..1, default 0)")
    p.add_argument("--seed", type=int, help="random seed for --fail-rate")
    p.add_argument("--vram-use-ratio", type=float, default=0.9,
                   help="each replica's simulated VRAM use, as a share of its claim (default 0.9; >1: over its claim)")
    p.add_argument("--kill", metavar="HOST", help="make HOST of the running simulator (same --data-dir) vanish")
    p.add_argument("--data-dir", help="the simulator's files (each host's credential under DATA_DIR/simulate); "
                                      "without a join token, the store's gpuflow.db there gives it")
    p.add_argument("--database-url", help="without a join token: the control plane's store, which gives it")
    p.add_argument("--join-token-file", metavar="FILE", help="a file holding the cluster's join token (or "
                                                             "GPUFLOW_AGENT__JOIN_TOKEN)")
    p.set_defaults(fn=cmd_simulate, temporal=True)
