"""The autoscaler that jumps (issue 38) on the real dev stack: Temporal, the control plane, one
agent with four simulated 24 GiB GPUs whose replicas are stand-in vLLM servers
(tests/standin_vllm.py), ``gpuflow gateway`` as a process, and the official ``openai`` client as
the load. One stack, one test, two phases:

1. **The ramp**: 10 callers arrive at a deployment of 1 replica whose ``concurrency`` rule wants
   2.5 requests in the system per replica: 10 / 2.5 = 4 replicas, a burst (4 >= 2 x 1 running).
   The autoscaler goes 1 -> 4 in ONE step (the issue saw 1 -> 3 in 20 s, one replica a step).
2. **The block**: 16 callers want 16 / 2.5 = 7 (ceil 6.4), capped at max_replicas 6; each
   replica takes 20 GiB of a 24 GiB GPU, and the four GPUs are full. The autoscaler is
   capacity-blocked, and ``capacity_blocked`` with its reason holds on every read for as long
   as the block does (the issue saw it true on one step in three); the blocked re-checks come
   every BLOCKED_RECHECK_S (3 s) plus the step's own time, measured here."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import pytest

from gpuflow import ops
from gpuflow.ports import server_port
from tests.gateway_stack import wait_model
from tests.live import FAST, Live, cli, spec
from tests.test_autoscale_live import Load, replicas

pytest.importorskip("gateway.app", reason="gpuflow gateway is not in this checkout")
pytest.importorskip("openai")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T = FAST.model_copy(update={"ready_timeout_s": 90, "drain_timeout_s": 60})
ENGINE = f"{sys.executable} {ROOT}/tests/standin_vllm.py --port {{port}} --host {{host}} --max-seqs 2"
# a 5 s interval (over the 3 s blocked re-check), a 5 s panic window (the last sample), a 10 s stable one;
# scale-in held off for the test.
# The load starts just after a step, so the next step's sample sees all 10 callers (a sample taken
# while the callers connect shows fewer, and a step to what it shows is what KPA does too)
AUTOSCALING = {"min_replicas": 1, "max_replicas": 6, "interval_s": 5, "stable_window_s": 10, "panic_window_s": 5,
               "scale_down_stabilization_s": 600, "rules": [{"kind": "concurrency", "target": 2.5, "min_samples": 5}]}


async def view(lv: Live) -> dict:
    v = await lv.client.get_workflow_handle("autoscaler/chat").query("autoscale")
    return v if isinstance(v, dict) else v.model_dump()


def applied_ups(hist: list[dict]) -> list[dict]:
    return [h for h in hist if h["direction"] == "up" and str(h.get("done", "")).startswith("replicas")]


async def test_a_ramp_jumps_to_its_count_in_one_step_and_a_block_holds(tmp_path):
    lv = await Live(str(tmp_path), t=T).start({"g1": [24, 24, 24, 24]})
    load = None
    try:
        base = lv.stack.start_gateway(server_port())
        await ops.deploy(lv.client, spec("chat", vram_gib=20, command=ENGINE, autoscaling=AUTOSCALING), T)
        await lv.wait(lambda: replicas(lv, "chat") == 1, 120, "1 RUNNING replica")
        await asyncio.to_thread(wait_model, base.removesuffix("/v1"), "chat", 1)

        # 1. the ramp: 10 callers -> 4 replicas, one step
        seen = (await view(lv))["history"][-1]["at"]
        await lv.wait_async(lambda: _steps_past(lv, seen), 30, "the next autoscaler step", every=0.1)
        t0 = time.monotonic()
        load = Load(base, "chat", workers=10)
        await lv.wait(lambda: replicas(lv, "chat") == 4, 120, "4 RUNNING replicas", every=0.5)
        up_s = time.monotonic() - t0
        await asyncio.sleep(4)  # at the count: the steps after it hold
        ups = applied_ups((await view(lv))["history"])
        assert [(u["current"], u["target"]) for u in ups] == [(1, 4)], [(u["current"], u["target"], u["signals"],
                                                                        u["reason"]) for u in ups]
        assert ups[0]["rule"] == "concurrency" and "burst" in ups[0]["reason"], ups[0]
        assert len(lv.states("chat")) == 4  # nothing more asked: 4 replicas, none PENDING
        await load.close()
        assert load.failed == [] and load.ok > 0
        ramp_ok = load.ok

        # 2. the block: 16 callers want 7 (6, max_replicas); the four GPUs hold four 20 GiB replicas
        load = Load(base, "chat", workers=16)
        await lv.wait_async(lambda: _blocked(lv), 60, "capacity-blocked", every=0.5)
        reads, t1 = [], time.monotonic()
        while time.monotonic() - t1 < 12:  # every read, 0.5 s apart, says blocked and why
            v = await view(lv)
            reads.append((v["capacity_blocked"], bool(v["blocked_reasons"]), v["desired"]))
            await asyncio.sleep(0.5)
        assert all(b and why for b, why, _ in reads), reads
        out = await asyncio.to_thread(cli, lv, "status", "--json", "--data-dir", lv.stack.data_dir)
        assert out.returncode == 0, out.stderr
        chat = next(d for d in json.loads(out.stdout)["deployments"] if d["name"] == "chat")
        assert chat["autoscaler"]["capacity_blocked"] and chat["autoscaler"]["blocked_reasons"], chat["autoscaler"]
        hist = (await view(lv))["history"]
        blocked = [h["at"] for h in hist if str(h.get("done", "")).startswith("capacity-blocked")]
        gaps = [round(b - a, 2) for a, b in zip(blocked, blocked[1:])]
        since = [(round(h["at"] - blocked[0], 2), h["direction"], h.get("rule"), h.get("done"), h.get("reason", "")[:90])
                 for h in hist if h["at"] >= blocked[0]]
        assert all(d == "up" for _, d, _, _, _ in since), since
        assert len(gaps) >= 3 and max(gaps) < 6, (gaps, since)  # the re-check + the step's time, no interval skipped
        await load.close()
        assert load.failed == []
        print(f"\n1 -> 4 replicas in {up_s:.1f} s, one step ({ramp_ok} requests, 0 failed); blocked on "
              f"{len(reads)}/{len(reads)} reads over 12 s; blocked re-checks every {min(gaps):.1f}-{max(gaps):.1f} s "
              f"(median {sorted(gaps)[len(gaps) // 2]:.1f} s)")
    finally:
        if load and not load.stop:
            await load.close()
        lv.close()


async def _steps_past(lv: Live, at: float) -> bool:
    return (await view(lv))["history"][-1]["at"] > at


async def _blocked(lv: Live) -> bool:
    return bool((await view(lv))["capacity_blocked"])
