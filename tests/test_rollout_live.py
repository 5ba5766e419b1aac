"""Rolling upgrades on the real dev stack: Temporal, the control plane, an agent with two
simulated 24 GiB GPUs, ``gpuflow gateway`` as a process, and replicas that are stand-in OpenAI
engines (tests/standin_engine.py) whose answers name their version. A continuous load through
the gateway with the official ``openai`` client (no client retries) sees no failed request while:
v1 -> v2 rolls surge-first onto the spare GPU; a version whose command exits at once is rolled
back while v2 keeps serving; a scale to 2 restarts nothing; v2 -> v3 with no spare GPU falls back
to stop-first after surge_timeout_s; `gpuflow rollout undo` rolls back to v2 the same way."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from gpuflow import ops
from gpuflow.ports import server_port
from scheduler.spec import ModelSpec
from tests.gateway_stack import wait_model
from tests.live import FAST, Live, cli

openai = pytest.importorskip("openai")

T = FAST.model_copy(update={"drain_timeout_s": 60})
ENGINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin_engine.py")


# surge_timeout_s 10 (the default is 60): a surge replica with a spare GPU is placed within a second or
# two, and the undo back to v2's spec, with no spare GPU, waits this long at each of its two steps
# before it goes stop-first (at 60 that one phase took 138 of the test's 190 s)
def version(v: str, replicas: int = 1, command: str | None = None, surge_timeout_s: float = 10) -> ModelSpec:
    cmd = command or f"{sys.executable} {ENGINE} --port {{port}} --host {{host}} --name {v} --token-s 0.01"
    return ModelSpec.model_validate({"name": "chat", "backend": "custom", "run_command": cmd, "replicas": replicas,
                                     "source": {"local_path": "/models/chat"},
                                     "resources": {"vram": 20 * 2**30, "ram": 2**30},  # one 24 GiB GPU each
                                     "rollout": {"surge_timeout_s": surge_timeout_s, "bake_s": 5}})  # bake: 5 s, not 60


class Load:
    """Four clients sending chat completions back to back; every outcome kept, with the version
    (the stand-in's --name, in the answer's id) that answered."""

    def __init__(self, base: str, workers: int = 4):
        self.ok, self.failed, self.seen, self.stop = 0, [], [], asyncio.Event()
        self.c = openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)
        self.tasks = [asyncio.ensure_future(self._run()) for _ in range(workers)]

    async def _run(self) -> None:
        while not self.stop.is_set():
            try:
                r = await self.c.chat.completions.create(model="chat", max_tokens=4,
                                                         messages=[{"role": "user", "content": "hi"}])
                self.ok += 1
                self.seen.append(r.id.split("-")[1])  # cmpl-<name>-<ns>
            except Exception as e:  # noqa: BLE001  every failure is a test failure, kept with its reason
                self.failed.append(f"{type(e).__name__}: {e}")
            await asyncio.sleep(0.02)

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)
        await self.c.close()


async def rollout(lv: Live) -> dict:
    return await lv.client.get_workflow_handle("deployment/chat").query("rollout")


async def settled(lv: Live, status: str, running: int, timeout: float = 180) -> dict:
    """Until the rollout is no longer rolling, says ``status`` and ``running`` replicas run."""
    view: dict = {}

    async def poll():
        nonlocal view
        while True:
            view = await rollout(lv)
            if not view["rolling"] and view["status"].startswith(status) and not view["stopping"] \
                    and list(lv.states("chat").values()) == ["running"] * running:
                return
            await asyncio.sleep(0.5)
    try:
        await asyncio.wait_for(poll(), timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"rollout not settled as {status!r}: {json.dumps(view, indent=1)}; {lv.states('chat')}")
    return view


def running_names(lv: Live) -> set[str]:
    return {n for n, s in lv.states("chat").items() if s == "running"}


async def test_rolling_upgrades_under_load(tmp_path):
    lv = await Live(str(tmp_path), t=T).start({"g1": [24, 24]})
    load = None
    try:
        lv.gateway = lv.stack.start_gateway(server_port())
        await ops.deploy(lv.client, version("v1"), T)
        await lv.wait(lambda: lv.states("chat") == {"chat-0": "running"}, 120, "v1 RUNNING")
        await asyncio.to_thread(wait_model, lv.gateway.removesuffix("/v1"), "chat", 1)  # the gateway re-reads the store every 0.5 s
        load = Load(lv.gateway)
        await lv.wait(lambda: load.ok >= 10 or load.failed, 60, "v1 answers through the gateway")

        # v1 -> v2, a GPU spare: surge first, never fewer than one replica serving
        await ops.deploy(lv.client, version("v2"), T)
        v = await settled(lv, "version 1 rolled out", 1)
        actions = [s["action"] for s in v["steps"]]
        assert actions[:1] == ["begin"] and "start_new" in actions and actions[-1] == "done", v["steps"]
        assert actions.index("start_new") < actions.index("stop_old"), v["steps"]  # surge first
        assert not any(s["fallback"] for s in v["steps"]) and running_names(lv) == {"chat-1"}
        mark = len(load.seen)
        await lv.wait(lambda: len(load.seen) >= mark + 10 or load.failed, 60, "v2 answers")
        assert set(load.seen[-5:]) == {"v2"} and {"v1", "v2"} <= set(load.seen)

        # a version whose command exits at once: rolled back, v2's replica serves throughout
        await ops.deploy(lv.client, version("bad", command="python3 -c 'raise SystemExit(3)'"), T)
        v = await settled(lv, "rolled back: ", 1)
        assert running_names(lv) == {"chat-1"}, lv.states("chat")  # never stopped
        status = (await lv.client.get_workflow_handle("deployment/chat").query("status"))
        assert "--name v2" in status["spec"]["run_command"]  # the last good spec is the target again
        out = await asyncio.to_thread(cli, lv, "rollout", "status", "chat")
        assert out.returncode == 0 and "rolled back: chat-2" in out.stdout, (out.stdout, out.stderr)

        # replicas only: nothing restarts
        await ops.scale(lv.client, "chat", 2)
        await lv.wait(lambda: len(running_names(lv)) == 2, 120, "2 RUNNING")
        assert "chat-1" in running_names(lv)

        # v2 -> v3 with no spare GPU: the surge replica waits 3 s, then each step is stop-first
        await ops.deploy(lv.client, version("v3", replicas=2, surge_timeout_s=3), T)
        v = await settled(lv, "version 3 rolled out", 2, timeout=300)
        assert [s for s in v["steps"] if s["fallback"]], v["steps"]
        mark = len(load.seen)
        await lv.wait(lambda: len(load.seen) >= mark + 10 or load.failed, 60, "v3 answers")
        assert set(load.seen[-5:]) == {"v3"}
        out = await asyncio.to_thread(cli, lv, "rollout", "status", "chat")
        assert out.returncode == 0 and "stop-first fallback" in out.stdout, out.stdout

        # undo: back to v2's spec, rolled the same way
        out = await asyncio.to_thread(cli, lv, "rollout", "undo", "chat")
        assert out.returncode == 0, out.stderr
        v = await settled(lv, "version 4 rolled out", 2, timeout=300)
        mark = len(load.seen)
        await lv.wait(lambda: len(load.seen) >= mark + 10 or load.failed, 60, "v2 answers again")
        assert set(load.seen[-5:]) == {"v2"}
        await load.finish()
        assert load.failed == [], load.failed[:5]
        print(f"\nrollout under load: {load.ok} requests answered, {len(load.failed)} failed")
    finally:
        if load and not load.stop.is_set():
            await load.finish()
        lv.close()


async def test_a_control_plane_worker_killed_mid_rollout_resumes_without_an_extra_stop(tmp_path):
    """Two v1 replicas and a spare GPU; the only control-plane worker is SIGKILLed right after
    the rollout stopped its first old replica, and a fresh one started: the rollout carries on
    from the replicas, each old replica is stopped once, two new ones are started, no more."""
    lv = await Live(str(tmp_path), t=T).start({"g1": [24, 24, 24]})
    load = None
    try:
        lv.gateway = lv.stack.start_gateway(server_port())
        await ops.deploy(lv.client, version("v1", replicas=2), T)
        await lv.wait(lambda: list(lv.states("chat").values()) == ["running"] * 2, 120, "2 v1 RUNNING")
        await asyncio.to_thread(wait_model, lv.gateway.removesuffix("/v1"), "chat", 2)  # the gateway re-reads the store every 0.5 s
        load = Load(lv.gateway)
        await lv.wait(lambda: load.ok >= 10 or load.failed, 60, "v1 answers through the gateway")
        await ops.deploy(lv.client, version("v2", replicas=2), T)

        async def first_stop():
            while not any(s["action"] == "stop_old" for s in (await rollout(lv))["steps"]):
                await asyncio.sleep(0.2)
        await asyncio.wait_for(first_stop(), 180)
        victim = lv.stack.servers[0]
        victim.send_signal(9)
        victim.wait(10)
        await asyncio.sleep(3)
        lv.stack.start_server()

        v = await settled(lv, "version 1 rolled out", 2, timeout=300)
        stops = [n for s in v["steps"] if s["action"] == "stop_old" for n in s["names"]]
        starts = [n for s in v["steps"] if s["action"] == "start_new" for n in s["names"]]
        assert sorted(stops) == ["chat-0", "chat-1"], v["steps"]  # each old replica once, no new one
        assert len(starts) == 2 and running_names(lv) == set(starts), (v["steps"], lv.states("chat"))
        await load.finish()
        assert load.failed == [], load.failed[:5]
        print(f"\nworker killed mid-rollout: {load.ok} requests answered, {len(load.failed)} failed")
    finally:
        if load and not load.stop.is_set():
            await load.finish()
        lv.close()


async def test_strategy_recreate_stops_every_replica_then_starts(tmp_path):
    """Today's behaviour, on request: both v1 replicas are stopped at once, then two v2 started
    at once (the spare GPU is not used for a surge), and the version bakes before it is good."""
    lv = await Live(str(tmp_path), t=T).start({"g1": [24, 24, 24]})
    try:
        sp = version("v1", replicas=2).model_dump(mode="json")
        sp["rollout"] = {"strategy": "recreate", "bake_s": 5}
        await ops.deploy(lv.client, ModelSpec.model_validate(sp), T)
        await lv.wait(lambda: list(lv.states("chat").values()) == ["running"] * 2, 120, "2 v1 RUNNING")
        seen: set[tuple[str, str]] = set()
        sp["run_command"] = sp["run_command"].replace("--name v1", "--name v2")
        await ops.deploy(lv.client, ModelSpec.model_validate(sp), T)
        await lv.wait(lambda: sorted(lv.states("chat")) == ["chat-2", "chat-3"]
                      and list(lv.states("chat").values()) == ["running"] * 2, 120, "2 v2 RUNNING",
                      check=lambda: seen.update(lv.states("chat").items()), every=0.1)
        v = await settled(lv, "version 1 rolled out", 2)  # then baked (issue 38)
        actions = [s["action"] for s in v["steps"]]
        assert actions[:2] == ["recreate", "start_new"] and actions[-2:] == ["bake", "done"], v["steps"]
        assert actions.count("start_new") == 1 and "stop_old" not in actions, v["steps"]  # waits between: fine
        assert v["steps"][1]["names"] == ["chat-2", "chat-3"], v["steps"]  # both at once: no surge
        assert [(h["version"], h["result"]) for h in v["history"]] == [(0, "deployed"), (1, "good")], v["history"]
    finally:
        lv.close()
