"""Rollouts that bake, and ``deploy --wait`` exit codes a CI can trust (issue 38), on the real dev
stack: Temporal, the control plane, an agent with two simulated 24 GiB GPUs, ``gpuflow gateway`` as
a process, replicas that are gpuflow's stand-in engine (gpuflow/demo/standin.py), and four clients
of the official ``openai`` package sending chat completions throughout (no client retries).

One stack, in order: v0 deployed; ``deploy --wait`` of v1 (a spare GPU: surge-first) exits 0 only
after v1's bake; v2, whose engine crashes 20 s after it starts (``--exit-after-s 20``), is rolled out,
then rolled back by its bake: ``deploy --wait`` exits 1 naming it, the history says ``rolled back``
and undo would go to v0, never v2; scaled to 2 (no spare GPU), ``deploy --wait`` of v3 waits through
a stop-first rollout and its bake and exits 0 (it exited 3 at once before)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from gpuflow import ops
from gpuflow.ports import server_port
from scheduler.spec import ModelSpec
from tests.gateway_stack import wait_model
from tests.live import FAST, Live, cli
from tests.test_rollout_live import Load, running_names

pytest.importorskip("openai")

T = FAST.model_copy(update={"drain_timeout_s": 60})


def version(v: str, replicas: int = 1, crash_s: float | None = None, bake_s: float = 8, **checks) -> dict:
    cmd = (f"{sys.executable} -m gpuflow.demo.standin --port {{port}} --host {{host}} --model-name chat-{v} "
           f"--token-s 0.01" + (f" --exit-after-s {crash_s:g}" if crash_s is not None else ""))
    return ModelSpec.model_validate({"name": "chat", "backend": "custom", "run_command": cmd, "replicas": replicas,
                                     "source": {"local_path": "/models/chat"},
                                     "resources": {"vram": 20 * 2**30, "ram": 2**30},  # one 24 GiB GPU each
                                     "rollout": {"surge_timeout_s": 3, "bake_s": bake_s, **checks}}
                                    ).model_dump(mode="json", exclude_none=True)


def deploy_wait(lv: Live, tmp_path, raw: dict, name: str) -> tuple[subprocess.CompletedProcess, float]:
    """``gpuflow deploy FILE --wait`` as a CI runs it: its outcome and how long it took."""
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(raw))
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "gpuflow", "deploy", str(p), "--wait", "--timeout", "200",
                          "--address", lv.stack.temporal.address], capture_output=True, text=True, timeout=260)
    return out, time.monotonic() - t0


async def rollout(lv: Live) -> dict:
    return await lv.client.get_workflow_handle("deployment/chat").query("rollout")


async def test_a_crash_after_start_is_rolled_back_by_the_bake_and_deploy_wait_says_so(tmp_path):
    lv = await Live(str(tmp_path), t=T).start({"g1": [24, 24]})
    load = None
    try:
        lv.gateway = lv.stack.start_gateway(server_port())
        await ops.deploy(lv.client, ModelSpec.model_validate(version("v0")), T)
        await lv.wait(lambda: lv.states("chat") == {"chat-0": "running"}, 120, "v0 RUNNING")
        await asyncio.to_thread(wait_model, lv.gateway.removesuffix("/v1"), "chat", 1)
        load = Load(lv.gateway)
        await lv.wait(lambda: load.ok >= 10 or load.failed, 60, "v0 answers through the gateway")

        # v1, surge-first onto the spare GPU: 0, and only once its 8 s bake passed, judged on the gateway's counters too
        checks = {"bake_max_error_ratio": 0.05, "bake_max_latency_p90_s": 5}
        out, took = await asyncio.to_thread(deploy_wait, lv, tmp_path, version("v1", **checks), "v1")
        v = await rollout(lv)
        assert out.returncode == 0, (out.stdout, out.stderr, v)
        assert "baking: " in out.stderr, out.stderr  # the progress line said so while it baked
        assert [(h["version"], h["result"]) for h in v["history"]] == [(0, "deployed"), (1, "good")], v["history"]
        assert [s for s in v["steps"] if s["action"] == "bake"] and v["steps"][-1]["reason"].startswith("baked "), v["steps"]
        assert "requests, error ratio 0.000 (<= 0.05), latency p90 <= " in v["steps"][-1]["reason"], v["steps"][-1]
        print(f"\nv1 surge-first: deploy --wait exit 0 after {took:.1f} s (8 s bake: {v['steps'][-1]['reason']})")

        # v2 crashes 20 s after it starts, after its last step: rolled back by the bake; exit 1
        failed_before = len(load.failed)
        out, took = await asyncio.to_thread(deploy_wait, lv, tmp_path, version("v2", crash_s=20, bake_s=40), "v2")
        assert out.returncode == 1, (out.stdout, out.stderr)
        await lv.wait_async(lambda: _settled(lv, "rolled back: "), 120, "v2 rolled back, v1 running again")
        v = await rollout(lv)
        v2 = next(h for h in v["history"] if h["version"] == 2)
        assert v2["result"] == "rolled back" and "into the bake" in v2["reason"], v["history"]
        assert any(s["action"] == "bake" and s["version"] == 2 for s in v["steps"]), v["steps"]
        assert v["version"] == 1 and v["undo"]["to"] == 0, v["undo"]  # undo: v0, never the failed v2
        print(f"v2 crash 20 s after start: deploy --wait exit 1 after {took:.1f} s ({out.stderr.strip().splitlines()[-1]}); "
              f"{len(load.failed) - failed_before} request(s) failed while no replica served")
        out = cli(lv, "rollout", "status", "chat")
        assert "v2" in out.stdout and "rolled back: " in out.stdout and "into the bake" in out.stdout, out.stdout
        mark = load.ok
        await lv.wait(lambda: load.ok >= mark + 10, 60, "v1 answers again")

        # two replicas, no spare GPU: v3 rolls stop-first (each surge replica unplaced 3 s) and bakes: 0
        await ops.scale(lv.client, "chat", 2)
        await lv.wait(lambda: len(running_names(lv)) == 2, 120, "2 RUNNING")
        out, took = await asyncio.to_thread(deploy_wait, lv, tmp_path, version("v3", replicas=2), "v3")
        v = await rollout(lv)
        assert out.returncode == 0, (out.stdout, out.stderr, v)
        assert [s for s in v["steps"] if s["fallback"]], v["steps"]  # stop-first
        assert next(h for h in v["history"] if h["version"] == v["version"])["result"] == "good", v["history"]
        print(f"v3 stop-first: deploy --wait exit 0 after {took:.1f} s")
        await load.finish()
        print(f"load: {load.ok} requests answered, {len(load.failed)} failed")
    finally:
        if load and not load.stop.is_set():
            await load.finish()
        lv.close()


async def _settled(lv: Live, status: str) -> bool:
    v = await rollout(lv)
    return not v["rolling"] and v["status"].startswith(status) and not v["stopping"] and \
        list(lv.states("chat").values()) == ["running"]
