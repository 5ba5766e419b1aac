"""`gpuflow rollout undo` on the real dev stack (issue 25): Temporal, the control plane, an agent
with two simulated 24 GiB GPUs, a gateway, and stand-in engines whose answers name their version.

v1; a version that exits at once is rolled back, and undo is refused (nothing good before v1),
saying so, with v1 still serving. Then v2; v3 fails and is rolled back to v2; undo lands on v1
(never v3), saying it skipped the failures; a second undo lands on v2. `rollout status` shows
every version with its result and when."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import httpx2 as httpx

from gpuflow import ops
from gpuflow.ports import server_port
from scheduler.spec import ModelSpec
from tests.gateway_stack import wait_model
from tests.live import FAST, Live, cli

T = FAST.model_copy(update={"drain_timeout_s": 60})
ENGINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin_engine.py")
BAD = "python3 -c 'raise SystemExit(3)'"


def version(v: str, command: str | None = None) -> ModelSpec:
    """One replica of 20 GiB (a whole 24 GiB GPU); the stand-in names ``v`` in its answers."""
    cmd = command or f"{sys.executable} {ENGINE} --port {{port}} --host {{host}} --name {v} --token-s 0.01"
    return ModelSpec.model_validate({"name": "chat", "backend": "custom", "run_command": cmd, "replicas": 1,
                                     "source": {"local_path": "/models/chat"},
                                     "resources": {"vram": 20 * 2**30, "ram": 2**30},
                                     "rollout": {"bake_s": 5}})  # each good version bakes 5 s (the default: 60)


async def settled(lv: Live, status: str, timeout: float = 180) -> dict:
    """Until the rollout is no longer rolling, says ``status``, and one replica runs."""
    h = lv.client.get_workflow_handle("deployment/chat")
    view: dict = {}

    async def poll():
        nonlocal view
        while True:
            view = await h.query("rollout")
            if not view["rolling"] and view["status"].startswith(status) and not view["stopping"] \
                    and list(lv.states("chat").values()) == ["running"]:
                return
            await asyncio.sleep(0.5)
    try:
        await asyncio.wait_for(poll(), timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"rollout not settled as {status!r}: {json.dumps(view, indent=1)}; {lv.states('chat')}")
    return view


async def answering(lv: Live, want: str, timeout: float = 60) -> None:
    """Until five answers in a row through the gateway come from version ``want``."""
    async with httpx.AsyncClient(timeout=30) as c:
        seen: list[str] = []

        async def poll():
            while seen[-5:] != [want] * 5:
                try:
                    r = await c.post(f"{lv.gateway}/chat/completions", json={
                        "model": "chat", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
                    seen.append(r.json()["id"].split("-")[1] if r.status_code == 200 else f"HTTP {r.status_code}")
                except httpx.HTTPError as e:
                    seen.append(type(e).__name__)
                await asyncio.sleep(0.1)
        try:
            await asyncio.wait_for(poll(), timeout)
        except asyncio.TimeoutError:
            raise AssertionError(f"{want} not answering; last answers {seen[-10:]}") from None


async def spec_name(lv: Live) -> str:
    status = await lv.client.get_workflow_handle("deployment/chat").query("status")
    return status["spec"]["run_command"].split("--name ")[1].split()[0]


async def test_undo_after_a_rollback_lands_on_the_good_version_and_is_refused_when_none(tmp_path):
    lv = await Live(str(tmp_path), t=T).start({"g1": [24, 24]})
    try:
        lv.gateway = lv.stack.start_gateway(server_port())
        await ops.deploy(lv.client, version("v1"), T)
        await lv.wait(lambda: lv.states("chat") == {"chat-0": "running"}, 120, "v1 RUNNING")
        await asyncio.to_thread(wait_model, lv.gateway.removesuffix("/v1"), "chat", 1)
        await answering(lv, "v1")

        # v1 -> bad, rolled back: nothing good before v1, so undo is refused with the reason
        await ops.deploy(lv.client, version("bad1", command=BAD), T)
        await settled(lv, "rolled back: ")
        out = await asyncio.to_thread(cli, lv, "rollout", "undo", "chat")
        assert out.returncode != 0, out.stdout
        assert ("nothing to undo to: no version before version 0 was good; skipped version 1 (rolled back: chat-1 "
                in out.stderr), out.stderr
        assert await spec_name(lv) == "v1" and lv.states("chat") == {"chat-0": "running"}  # nothing changed
        await answering(lv, "v1")

        # v1 -> v2 -> v3 fails (rolled back to v2): undo lands on v1, the last good before v2, never v3
        await ops.deploy(lv.client, version("v2"), T)
        await settled(lv, "version 2 rolled out")
        await ops.deploy(lv.client, version("bad3", command=BAD), T)
        await settled(lv, "rolled back: ")
        assert await spec_name(lv) == "v2"
        out = await asyncio.to_thread(cli, lv, "rollout", "status", "chat")
        assert out.returncode == 0, out.stderr
        for line in ("v0  ", "v1  ", "v2  ", "v3  "):
            assert line in out.stdout, out.stdout
        assert "rolled back: chat-" in out.stdout and "good  (current)" in out.stdout, out.stdout
        assert "undo would go to version 0's spec" in out.stdout, out.stdout

        out = await asyncio.to_thread(cli, lv, "rollout", "undo", "chat")
        assert out.returncode == 0, out.stderr
        said = out.stdout.splitlines()[0]
        assert said.startswith("undo from version 2 to version 0's spec (deployed at "), said
        assert "skipped version 3 (rolled back: chat-" in said and "version 1 (rolled back: chat-1 " in said, said
        v = await settled(lv, "version 4 rolled out")
        assert await spec_name(lv) == "v1"
        assert not [s for s in v["steps"][-6:] if s["action"] == "rollback"], v["steps"]  # no failure re-applied
        await answering(lv, "v1")
        assert [(h["version"], h["result"], h["undo_of"]) for h in v["history"]] == [
            (0, "deployed", None), (1, "rolled back", None), (2, "good", None), (3, "rolled back", None),
            (4, "good", 0)], v["history"]
        assert all(h["at"] for h in v["history"])

        # a second undo goes back to the version the first one left: v2
        out = await asyncio.to_thread(cli, lv, "rollout", "undo", "chat")
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("undo from version 4 to version 2's spec (good at "), out.stdout
        await settled(lv, "version 5 rolled out")
        assert await spec_name(lv) == "v2"
        await answering(lv, "v2")
    finally:
        lv.close()
