"""The serving path end to end on the real dev stack: Temporal, the control plane, an agent that
serves the SmolLM2 GGUF through llama-cpp-python on this machine's CPU, and ``gpuflow gateway`` as
a process, asked with the official ``openai`` client. Replicas die, are scaled away and deleted
in the middle of a load, and not one request fails."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import urllib.request

import pytest

from store import serving
from gpuflow import ops
from gpuflow.ports import server_port
from scheduler.spec import ModelSpec
from tests.live import FAST, Live

pytest.importorskip("gateway.app", reason="gpuflow gateway is not in this checkout")
openai = pytest.importorskip("openai")

T = FAST.model_copy(update={"ready_timeout_s": 180, "drain_timeout_s": 120})


@pytest.fixture(scope="module")
async def stack(tmp_path_factory):
    """One CPU-only host whose agent serves llama.cpp models with this Python's llama-cpp-python,
    and one gateway."""
    lv = Live(str(tmp_path_factory.mktemp("gw")), t=T)
    try:
        await lv.start({"cpu1": []}, agent_args=["--llama-cpp-python", sys.executable])
        lv.gateway = lv.stack.start_gateway(server_port())
        yield lv
    finally:
        lv.close()


def smol(name: str, replicas: int, path: str) -> ModelSpec:
    return ModelSpec.model_validate({"name": name, "source": {"local_path": path}, "backend": "llama.cpp",
                                     "replicas": replicas, "cpu_offloading": True,
                                     "backend_parameters": ["-c", "512"]})


def client(lv: Live) -> "openai.AsyncOpenAI":
    # no client-side retries: a request the gateway lets fail must show up as a failure here
    return openai.AsyncOpenAI(base_url=lv.gateway, api_key="unused", max_retries=0, timeout=120)


async def deploy(lv: Live, sp: ModelSpec) -> dict[str, int]:
    """Deploy and wait until every replica is RUNNING; instance -> pid."""
    await ops.deploy(lv.client, sp, T)
    await lv.wait(lambda: list(lv.states(sp.name).values()) == ["running"] * sp.replicas, 240,
                  f"{sp.replicas} RUNNING replicas of {sp.name}")
    await lv.wait(lambda: routed(lv, sp.name) == sp.replicas, 30, f"the gateway routing to {sp.replicas} replicas")
    return {i.name: i.pid for i in lv.instances(sp.name) if i.state == "running"}


def routed(lv: Live, model: str) -> int:
    """Replicas of ``model`` in the gateway's routing table (it re-reads the store every 0.5 s)."""
    with urllib.request.urlopen(f"{lv.gateway}/models", timeout=10) as r:
        return next((m["replicas"] for m in json.load(r)["data"] if m["id"] == model), 0)


def completions(lv: Live, instance: str) -> int:
    """Chat completions the replica answered, from its server's access log on the host."""
    rec = lv.stack.instance_processes("cpu1").find(instance)
    with open(rec.log, errors="replace") as f:
        return sum("POST /v1/chat/completions" in ln and " 200" in ln for ln in f)


class Load:
    """``workers`` clients sending plain chat completions back to back until stopped; every
    outcome is kept."""

    def __init__(self, lv: Live, model: str, workers: int = 4, max_tokens: int = 4):
        self.ok, self.failed, self.stop = 0, [], asyncio.Event()
        self.c = client(lv)
        self.tasks = [asyncio.ensure_future(self._run(model, max_tokens)) for _ in range(workers)]

    async def _run(self, model: str, max_tokens: int) -> None:
        while not self.stop.is_set():
            try:
                r = await self.c.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "Say hi."}], max_tokens=max_tokens)
                assert r.choices[0].message.content is not None
                self.ok += 1
            except Exception as e:  # noqa: BLE001  every failure is a test failure, kept with its reason
                self.failed.append(f"{type(e).__name__}: {e}")

    async def until(self, n: int, timeout: float = 120) -> None:
        """Until ``n`` more requests succeeded."""
        goal = self.ok + n
        for _ in range(int(timeout * 10)):
            if self.ok >= goal or self.failed:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"{n} requests did not succeed within {timeout:g} s")

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)
        await self.c.close()


async def test_a_real_smollm2_replica_answers_through_the_gateway(stack, smollm2):
    await deploy(stack, smol("smol", 1, smollm2))
    async with client(stack) as c:
        assert "smol" in [m.id for m in (await c.models.list()).data]
        r = await c.chat.completions.create(model="smol", max_tokens=16, temperature=0,
                                            messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert r.choices[0].message.content.strip() and r.usage.completion_tokens > 0
        with pytest.raises(openai.NotFoundError):
            await c.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    await ops.delete(stack.client, "smol")
    await stack.wait(lambda: stack.states("smol") == {}, 60, "smol deleted")


async def test_two_replicas_share_the_load_and_one_dies_without_a_failed_request(stack, smollm2):
    pids = await deploy(stack, smol("pair", 2, smollm2))
    load = Load(stack, "pair")
    try:
        await load.until(12)
        # both replicas take a share (least outstanding requests). A replica's access log counts a request
        # once it is answered, and on a loaded machine one replica's first answers can take as long as a
        # dozen of the other's: wait for them rather than read the logs at one instant.
        await stack.wait(lambda: all(completions(stack, n) for n in pids), 60, "both replicas answering",
                         check=lambda: None if not load.failed else pytest.fail(str(load.failed[:3])))
        victim = sorted(pids)[0]
        os.killpg(pids[victim], signal.SIGKILL)  # the server and anything it started, at once
        await load.until(12)  # the load goes on, on the other replica
        await stack.wait(lambda: stack.states("pair") == {n: "running" for n in pids}, 120,
                         "the killed replica restarted")
        await load.until(12)
    finally:
        await load.finish()
    assert load.failed == [], load.failed[:5]
    await ops.delete(stack.client, "pair")
    await stack.wait(lambda: stack.states("pair") == {}, 120, "pair deleted")


async def test_scale_down_in_the_middle_of_a_load_drains(stack, smollm2):
    pids = await deploy(stack, smol("duo", 2, smollm2))
    load = Load(stack, "duo", max_tokens=24)
    seen: set[tuple[str, str]] = set()
    try:
        await load.until(8)
        await ops.scale(stack.client, "duo", 1)
        await stack.wait(lambda: len(stack.states("duo")) == 1, 120, "one replica left",
                         check=lambda: seen.update(stack.states("duo").items()), every=0.1)
        await load.until(8)
    finally:
        await load.finish()
    assert load.failed == [], load.failed[:5]
    gone = (set(pids) - set(stack.states("duo"))).pop()
    assert (gone, "draining") in seen  # it left the routing table before it stopped
    await ops.delete(stack.client, "duo")
    await stack.wait(lambda: stack.states("duo") == {}, 120, "duo deleted")


async def test_delete_lets_the_requests_in_flight_finish(stack, smollm2):
    await deploy(stack, smol("solo", 1, smollm2))
    async with client(stack) as c:
        calls = [asyncio.ensure_future(c.chat.completions.create(
            model="solo", messages=[{"role": "user", "content": "Count from one to one hundred, one number a line."}],
            max_tokens=200))  # long enough to be in flight when the drain starts, on a loaded machine too
            for _ in range(3)]
        await stack.wait(lambda: serving.in_flight(stack.engine, "solo-0") >= 1, 60, "requests in flight")
        await ops.delete(stack.client, "solo")
        seen: set[str] = set()
        await stack.wait(lambda: stack.states("solo").get("solo-0", "gone") != "running", 30, "solo-0 leaving",
                         check=lambda: seen.update(stack.states("solo").values()), every=0.1)
        done = await asyncio.gather(*calls, return_exceptions=True)
    assert all(not isinstance(r, BaseException) and r.choices[0].message.content for r in done), done
    assert "draining" in seen
    await stack.wait(lambda: stack.states("solo") == {}, 60, "solo deleted once drained")
