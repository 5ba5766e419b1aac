"""Engines behind a key, on the dev stack (issue 40): a replica's port asked directly answers 401
without its engine key, and with a wrong one, while the same request through the gateway, with the
official ``openai`` client, is served. The key is in no workflow's history, no argv and no log;
after an agent restart (SIGKILL; the engine keeps running and is adopted) the gateway still serves
it with the same key. The replica is a stand-in engine (tests/standin_engine.py) started by the
agent as a custom command, which reads its key from GPUFLOW_ENGINE_API_KEY as the agent sets it."""

from __future__ import annotations

import asyncio
import os
import sys

import httpx2 as httpx
import openai

from gpuflow import ops
from gpuflow.ports import server_port
from tests import gateway_stack as gs
from tests.live import FAST, Live, spec
from tests.test_lifecycle import supervisor_on

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINE = f"{sys.executable} {ROOT}/tests/standin_engine.py --port {{port}} --host {{host}} --name chat"
ASK = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def row(lv: Live):
    return next(i for i in lv.instances("chat") if i.name == "chat-0")


def direct(r, key: str | None) -> int:
    """The replica's own port, asked as anyone who reaches it would: the status."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return httpx.post(f"http://{r.address}:{r.port}/v1/chat/completions", json=ASK, headers=headers,
                      timeout=10).status_code


async def through_gateway(url: str) -> str:
    async with openai.AsyncOpenAI(base_url=url, api_key="anything", timeout=30, max_retries=0) as client:
        out = await client.chat.completions.create(**ASK)
    return out.choices[0].message.content or ""


def files_under(folder: str) -> list[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs]


async def test_a_replicas_port_without_its_key_answers_401_while_the_gateway_serves_it(tmp_path):
    t = FAST.model_copy(update={"unreachable_grace_s": 60})  # the agent's restart below is not a lost host
    lv = await Live(str(tmp_path), t=t).start({"h1": [24]})
    try:
        gateway = lv.stack.start_gateway(server_port())
        await ops.deploy(lv.client, spec("chat", vram_gib=4, command=ENGINE), t)
        await lv.wait(lambda: lv.states("chat") == {"chat-0": "running"}, 60, "RUNNING")
        first = row(lv)
        key = first.engine_key
        assert key and key.startswith("gfe-"), "the store made the replica's key from its launch's nonce"
        assert direct(first, None) == 401  # no key: the port alone serves nothing
        assert direct(first, "gfe-" + "A" * 43) == 401  # a wrong key (of the right form)
        assert direct(first, key) == 200  # the key the store made is the engine's own
        # the gateway's table has read the replica (it refreshes on its own pace)
        await asyncio.to_thread(gs.wait_model, gateway.removesuffix("/v1"), "chat", 1, 30.0)
        assert (await through_gateway(gateway)).startswith("tok0")

        # where the key is not: the workflow's history (it holds the nonce), the argv, any log or pid file
        history = (await lv.client.get_workflow_handle("instance/chat-0").fetch_history()).to_json()
        assert key not in history
        with open(f"/proc/{first.pid}/cmdline", "rb") as f:
            assert key.encode() not in f.read()
        for path in files_under(os.path.join(lv.stack.data_dir, "agent")) + files_under(lv.stack.log_dir):
            if not path.endswith(("credential.json", ".db", ".db-wal", ".db-shm")):
                with open(path, "rb") as f:
                    assert key.encode() not in f.read(), path

        # the agent dies (its engine keeps running) and a new run adopts the engine: same process, same key
        lv.stack.kill_host("h1", processes=False)
        lv.add_host("h1", [24])
        agent = lv.stack.agents["h1"].pid
        for _ in range(200):  # supervised by the new agent run (60 s at most)
            if row(lv).state == "running" and await supervisor_on(lv, "chat-0", agent):
                break
            await asyncio.sleep(0.3)
        else:
            raise AssertionError(f"not supervised by the new agent run: {row(lv)}")
        again = row(lv)
        assert (again.pid, again.engine_key, again.restarts) == (first.pid, key, 0)
        assert direct(again, None) == 401
        assert (await through_gateway(gateway)).startswith("tok0")
    finally:
        lv.close()
