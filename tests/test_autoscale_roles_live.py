"""Per-role autoscaling of a prefill/decode group on the real dev stack (issue 35): Temporal, the
control plane, two agents with simulated GPUs. The group's prefill runs ``gpuflow standin`` (no
metrics: nothing says it is busy); its decode runs the stand-in vLLM server (tests/standin_vllm.py:
at most 2 sequences decode at once, one step 0.01 + 0.02 x batch s, vLLM's metric names), loaded
with the official ``openai`` client straight at the decode's port. Short windows are set in the
spec, as an operator would for a test:

- decode on ITL: a full decode steps at 0.01 + 0.02 x 2 = 50 ms a token > 40 ms: up, 1 -> 2
  (max 2), through the deployment's ``scale_role``; the prefill (no traffic, at its min 1) holds.
  The prefill member keeps its pid, no request fails, and the decode's step is kept and replays
  the same.
- a capacity-blocked role says why and the other still scales: decode pinned to h1's 12 GiB GPU
  (one 8 GiB member: 4 GiB left), prefill to h2's 24 GiB GPU (room for a second); both loaded, the
  decode on ITL and the prefill on its queue (6 clients on 2 slots: 4 waiting >= 3). The prefill
  goes 1 -> 2; the decode is blocked, naming decode and the scheduler's reason, with no PENDING
  member created.
- decode on KV-cache usage from the stand-in PD engines (``gpuflow standin --pd-role``, the vLLM
  proxy's protocol: prefill with ``do_remote_decode``, then the decode pulls the KV): a decode of
  100 KV blocks holding 4-6 prompts of ~29 blocks each is > 85% full: decode 1 -> 2; the prefill's
  own TTFT (~50 ms < 150 ms) votes down, held at its min 1."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import httpx2 as httpx

import pytest

from contracts.ids import autoscaler_id
from gpuflow.workflow_views import autoscale_view
from store import decision_log, serving
from store.decision_replay import replay_row
from tests.gateway_stack import metric
from tests.live import Live, cli
from tests.test_decision_replay_live import explain
from tests.test_groups_live import STANDIN
from tests.test_autoscale_live import Load
from tests.test_groups_live import deploy, gone, group, members, running

pytestmark = pytest.mark.asyncio
openai = pytest.importorskip("openai")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINE = f"{sys.executable} {ROOT}/tests/standin_vllm.py --port {{port}} --host {{host}} --max-seqs 2"
# windows of 3 s (panic 1 s) on 1 s samples, 5 requests as evidence; no scale-down inside the test
AUTOSCALING = {"interval_s": 1, "stable_window_s": 3, "panic_window_s": 1, "scale_down_stabilization_s": 600,
               "roles": {"prefill": {"min_replicas": 1, "max_replicas": 2, "rules": [{"kind": "ttft", "min_samples": 5}]},
                         "decode": {"min_replicas": 1, "max_replicas": 2,
                                    "rules": [{"kind": "itl", "up_above_s": 0.04, "down_below_s": 0.015,
                                               "min_samples": 5}]}}}


@pytest.fixture(scope="module")
async def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pd-autoscale")
    hook = f"{sys.executable} {ROOT}/deploy/hooks/log-demand.py {tmp / 'demand.jsonl'}"  # the capacity hook's demands
    lv = await Live(str(tmp), env={"GPUFLOW_CAPACITY_HOOK": hook}).start({"h1": [12], "h2": [24]})
    lv.demand = str(tmp / "demand.jsonl")
    yield lv
    lv.close()


class KeyedLoad(Load):
    """tests/test_autoscale_live.py's Load, showing the engine's key (the agent guards every engine)."""

    def __init__(self, base: str, model: str, workers: int, key: str | None):
        self.c = openai.AsyncOpenAI(base_url=base, api_key=key or "unused", max_retries=0, timeout=120)
        self.model, self.ok, self.failed, self.stop = model, 0, [], False
        self.tasks = [asyncio.ensure_future(self._run()) for _ in range(workers)]


def endpoint(lv: Live, name: str, role: str):
    return next(r for r in serving.group_members(lv.engine)[name].routes if r.role == role)


def of_role(lv: Live, name: str, role: str) -> list:
    return [i for i in members(lv, name).values() if i.role == role]


async def test_a_per_role_step_moves_decode_alone(stack):
    lv, name = stack, "pd-auto"
    raw = group(name, [{"name": "prefill"}, {"name": "decode", "run_command": ENGINE}], autoscaling=AUTOSCALING)
    await deploy(lv, raw)
    await running(lv, name, 2)
    prefill = of_role(lv, name, "prefill")[0]
    decode = next(r for r in serving.group_members(lv.engine)[name].routes if r.role == "decode")
    load = KeyedLoad(f"http://{decode.address}:{decode.port}/v1", name, 6, decode.engine_key)
    try:
        await lv.wait(lambda: len(of_role(lv, name, "decode")) == 2
                      and all(i.state == "running" for i in of_role(lv, name, "decode")), 90,
                      "a second decode RUNNING")
    finally:
        await load.close()
    assert load.failed == [] and load.ok > 0
    v = await autoscale_view(lv.client, name)
    hist = v["history"]
    ups = [h for h in hist if h.get("direction") == "up"]
    # decode alone moved: its one up step set 1 -> 2 on ITL; the prefill never left 1
    assert [(h["role"], h["done"]) for h in ups] == [("decode", "decode 1 -> 2")], ups
    assert "ITL P90" in ups[0]["reason"] and ups[0]["rule"] == "itl"
    assert {h["role"] for h in hist if "role" in h} == {"prefill", "decode"}
    assert all(h["done"] == "nothing" for h in hist if h.get("role") == "prefill")
    assert {r["role"]: r["desired"] for r in v["roles"]} == {"prefill": 1, "decode": 2}
    now = of_role(lv, name, "prefill")
    assert [(i.name, i.pid) for i in now] == [(prefill.name, prefill.pid)]  # the prefill was not touched
    # the decode's step was kept with its role and replays to the same decision
    def kept_up():
        return [r for r in decision_log.history(lv.engine, name) if r.kind == "autoscale" and r.outcome == "up"]

    await lv.wait(lambda: bool(kept_up()), 30, "the decode's up step kept in the store")
    up = kept_up()
    got = replay_row(lv.engine, up[-1])
    assert got["same"] and got["recorded"].startswith("up to 2 replica(s) by itl"), got
    out = explain(lv, name, "--replay", "--decision", up[-1].digest[:16])  # as users run it
    assert out.returncode == 0 and "same decision: up to 2 replica(s) by itl: ITL P90" in out.stdout, \
        out.stdout + out.stderr
    await gone(lv, name)


async def test_a_blocked_role_says_why_and_the_other_still_scales(stack):
    lv, name = stack, "pd-blocked"
    auto = {**AUTOSCALING, "roles": {"prefill": {"max_replicas": 2, "rules": [{"kind": "queue", "up_queue": 3,
                                                                               "min_samples": 5}]},
                                     "decode": AUTOSCALING["roles"]["decode"]}}
    raw = group(name, [{"name": "prefill", "run_command": ENGINE, "gpu_selector": {"gpu_ids": ["h2:cuda:0"]}},
                       {"name": "decode", "run_command": ENGINE, "gpu_selector": {"gpu_ids": ["h1:cuda:0"]}}],
                autoscaling=auto)
    await deploy(lv, raw)
    await running(lv, name, 2)
    loads = [KeyedLoad(f"http://{r.address}:{r.port}/v1", name, 6, r.engine_key)
             for r in (endpoint(lv, name, "prefill"), endpoint(lv, name, "decode"))]
    try:
        await lv.wait(lambda: len(of_role(lv, name, "prefill")) == 2
                      and all(i.state == "running" for i in of_role(lv, name, "prefill")), 90,
                      "a second prefill RUNNING")

        seen = {}

        async def decode_blocked() -> bool:  # the autoscaler's view kept at the moment it says so
            seen["v"] = await autoscale_view(lv.client, name)
            return any(r["role"] == "decode" and r["capacity_blocked"] for r in (seen["v"] or {}).get("roles", []))

        await lv.wait_async(decode_blocked, 60, "the decode capacity-blocked")

        async def status_says_it() -> bool:  # while loaded: each blocked step re-asks every 3 s
            out = (await asyncio.to_thread(cli, lv, "status")).stdout
            return "CAPACITY-BLOCKED: role decode: no host fits one more member" in out and "prefill desired 2" in out

        await lv.wait_async(status_says_it, 30, "gpuflow status naming the blocked decode")

        def series() -> bool:  # the control plane's per-role series, while the decode is blocked
            text = httpx.get(f"http://{lv.stack.metrics['server-0']}/metrics").text
            return (metric(text, "gpuflow_autoscaler_role_capacity_blocked", deployment=name, role="decode") == 1
                    and metric(text, "gpuflow_autoscaler_role_desired_replicas", deployment=name, role="prefill") == 2)

        await lv.wait(series, 30, "gpuflow_autoscaler_role_* showing the blocked decode")
        # the Temporal UI's "current details" of the autoscaler name both roles' last steps
        md = await lv.client.get_workflow_handle(autoscaler_id(name)).query("__temporal_workflow_metadata")
        assert "by rule `prefill: " in md.current_details and "by rule `decode: itl`" in md.current_details, \
            md.current_details
    finally:
        for load in loads:
            await load.close()
    assert all(load.failed == [] and load.ok > 0 for load in loads)
    v = seen["v"]
    decode = next(r for r in v["roles"] if r["role"] == "decode")
    assert decode["desired"] == 1 and decode["blocked_reasons"][0] == "role decode: no host fits one more member"
    blocked = [h for h in v["history"] if h.get("role") == "decode" and h.get("done") == "capacity-blocked: no decode added"]
    assert blocked and blocked[-1]["direction"] == "up" and blocked[-1]["dry_run"]["fits"] == 0
    assert [h["done"] for h in v["history"] if h.get("role") == "prefill" and h.get("direction") == "up"][:1] == \
        ["prefill 1 -> 2"]
    assert len(of_role(lv, name, "decode")) == 1  # no PENDING decode was created
    # the capacity hook heard the decode's demand: one more member of 8 GiB, naming the role
    wants = [json.loads(x) for x in open(lv.demand)]
    assert {(w["deployment"], w["role"], w["replicas"]) for w in wants} == {(name, "decode", 1)}, wants
    assert wants[0]["per_replica"]["vram_bytes"] >= 8 * 2**30 and wants[0]["reasons"][0].startswith("role decode")
    line = cli(lv, "autoscale", name)
    assert line.returncode == 0 and "decode:itl" in line.stdout and "prefill:queue" in line.stdout, line.stdout
    one = cli(lv, "autoscale", name, "--role", "decode")
    assert one.returncode == 0 and "decode:itl" in one.stdout and "prefill" not in one.stdout, one.stdout
    await gone(lv, name)


PROMPT = "Summarise the history of the printing press. " * 40  # ~1 800 chars: ~450 tokens, 29 blocks of 16


async def proxied(prefill: openai.AsyncOpenAI, decode: openai.AsyncOpenAI, done: list, stop: asyncio.Event):
    """Requests as vLLM's disaggregated proxy sends them, back to back: the prefill (max_tokens 1,
    ``do_remote_decode``), then the decode with the prefill's ``kv_transfer_params``."""
    while not stop.is_set():
        p = await prefill.completions.create(model="standin", prompt=PROMPT, max_tokens=1, stream=False,
                                             extra_body={"kv_transfer_params": {"do_remote_decode": True}})
        d = await decode.completions.create(model="standin", prompt=PROMPT, max_tokens=32,
                                            extra_body={"kv_transfer_params": p.model_dump()["kv_transfer_params"]})
        done.append(d.model_dump()["gpuflow_kv"]["source"])


async def test_decode_scales_on_the_pd_engines_kv_usage(stack):
    lv, name = stack, "pd-kv"
    auto = {**AUTOSCALING, "roles": {"prefill": AUTOSCALING["roles"]["prefill"],
                                     "decode": {"max_replicas": 2, "rules": [{"kind": "kv_usage", "min_samples": 5}]}}}
    kv = f"{STANDIN} --kv-port {{kv_port}} --pd-role {{pd_role}}"
    raw = group(name, [{"name": "prefill", "run_command": kv},
                       {"name": "decode", "run_command": f"{kv} --kv-blocks 100 --token-s 0.02"}], autoscaling=auto)
    await deploy(lv, raw)
    await running(lv, name, 2)
    p, d = endpoint(lv, name, "prefill"), endpoint(lv, name, "decode")
    clients = [openai.AsyncOpenAI(base_url=f"http://{r.address}:{r.port}/v1", api_key=r.engine_key or "none",
                                  max_retries=0, timeout=60) for r in (p, d)]
    done, stop = [], asyncio.Event()
    tasks = [asyncio.ensure_future(proxied(*clients, done, stop)) for _ in range(6)]
    try:
        await lv.wait(lambda: len(of_role(lv, name, "decode")) == 2, 90, "a second decode")
    finally:
        stop.set()
        await asyncio.gather(*tasks)  # a failed request raises here
        for c in clients:
            await c.close()
    assert done and set(done) == {"remote"}, done  # every one decoded from the prefill's KV
    v = await autoscale_view(lv.client, name)
    ups = [h for h in v["history"] if h.get("direction") == "up"]
    assert [(h["role"], h["rule"], h["done"]) for h in ups] == [("decode", "kv_usage", "decode 1 -> 2")], ups
    assert ups[0]["signals"]["kv_usage"] > 0.85, ups[0]
    ttft = [h["reason"] for h in v["history"] if h.get("role") == "prefill" and "TTFT P90" in h.get("reason", "")]
    assert ttft and all(h["done"] == "nothing" for h in v["history"] if h.get("role") == "prefill"), v["history"]
    await gone(lv, name)
