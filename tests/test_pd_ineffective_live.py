"""``pd_ineffective`` raised when a group's decodes stop receiving KV, and cleared when transfers
resume (issue 35), on a dev stack: the Temporal dev server, a control-plane worker and an agent
whose 1P1D group runs real ``gpuflow standin`` processes in the prefill and decode roles.

Requests go the way vLLM's disaggregated proxy sends them (toy_proxy_server.py), with the official
``openai`` client: to the prefill with ``kv_transfer_params: {do_remote_decode: true}``,
``max_tokens: 1``, then to the decode with the prefill's answer; a prefill or a transfer that fails
is served by the decode whole (the fallback every router makes). The deployment workflow's check
(workflows/pd_watch.py, every 15 s) reads the decode's own metrics; the degradation is read back
where users see it: ``gpuflow status``, the Temporal UI's current details and
``gpuflow_group_degraded``. The prefill's side channel is made to refuse every pull
(``POST /standin/faults``) for the failing phase, then resumes."""

from __future__ import annotations

import asyncio
import socket
import sys
import time

import httpx2 as httpx
import openai
import pytest

from activities.metrics import StoreCollector
from contracts.ids import deployment_id
from gpuflow import ops
from scheduler.spec import ModelSpec
from tests.live import FAST, Live, cli
from tests.test_temporal_ui_live import describe

pytestmark = pytest.mark.asyncio
GiB = 2**30
STANDIN = f"{sys.executable} -m gpuflow standin --port {{port}} --host {{host}}"
PROMPT = "Summarise the history of the printing press. " * 40  # ~1 800 chars: a prompt worth disaggregating


def server_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group(name: str, kv_port: int) -> dict:
    return {"name": name, "backend": "custom", "run_command": STANDIN, "source": {"local_path": f"/models/{name}"},
            "resources": {"vram": 8 * GiB, "ram": GiB}, "disaggregation": {"mode": "custom"},
            "roles": [{"name": "prefill", "run_command": f"{STANDIN} --pd-role prefill --kv-port {kv_port}"},
                      {"name": "decode", "run_command": f"{STANDIN} --pd-role decode"}]}


def ends(lv: Live, name: str) -> dict[str, object]:
    return {i.role: i for i in lv.instances(name) if i.state == "running" and i.address and i.port}


def client_of(row) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://{row.address}:{row.port}/v1", api_key=row.engine_key or "none",
                              max_retries=0, timeout=20)


async def one(prefill: openai.AsyncOpenAI, decode: openai.AsyncOpenAI) -> str:
    """One request as the proxy sends it; where the decode's KV came from (remote or local)."""
    params = None
    try:
        p = await prefill.completions.create(model="standin", prompt=PROMPT, max_tokens=1, stream=False,
                                             extra_body={"kv_transfer_params": {"do_remote_decode": True}})
        params = p.model_dump().get("kv_transfer_params")
    except openai.APIError:
        pass  # the prefill failed: the decode serves it whole
    try:
        d = await decode.completions.create(model="standin", prompt=PROMPT, max_tokens=8,
                                            extra_body={"kv_transfer_params": params} if params else None)
    except openai.APIStatusError:  # the pull failed (503, before any byte): the decode serves it whole
        d = await decode.completions.create(model="standin", prompt=PROMPT, max_tokens=8)
    return d.model_dump()["gpuflow_kv"]["source"]


async def load(prefill, decode, seen: list[str], stop: asyncio.Event) -> None:
    while not stop.is_set():
        seen.append(await one(prefill, decode))
        await asyncio.sleep(0.2)


def gauge(lv: Live, name: str) -> float | None:
    fam = next(f for f in StoreCollector(lv.engine).collect() if f.name == "gpuflow_group_degraded")
    return next((x.value for x in fam.samples if x.labels == {"deployment": name, "kind": "pd_ineffective"}), None)


async def raised(lv: Live, name: str) -> bool:
    return "pd_ineffective" in (await ops.current(lv.client, name)).degraded


async def test_pd_ineffective_is_raised_when_the_decodes_stop_receiving_kv_and_clears(tmp_path):
    lv = await Live(str(tmp_path)).start({"h1": [24, 24]})
    try:
        await ops.deploy(lv.client, ModelSpec.model_validate(group("pdx", server_port())), FAST)
        await lv.wait(lambda: set(ends(lv, "pdx")) == {"prefill", "decode"}, 90, "the prefill and the decode RUNNING")
        e = ends(lv, "pdx")
        prefill, decode = client_of(e["prefill"]), client_of(e["decode"])
        seen: list[str] = []
        stop = asyncio.Event()
        task = asyncio.create_task(load(prefill, decode, seen, stop))
        # healthy: every request decodes from the prefill's KV; two checks (15 s apart) see only remote ones
        await asyncio.sleep(35)
        assert seen and set(seen) == {"remote"}, seen
        assert not await raised(lv, "pdx") and gauge(lv, "pdx") == 0
        # the prefill's side channel refuses every pull: each decode fails its pull (503) and serves whole
        async with httpx.AsyncClient() as http:
            r = await http.post(f"http://{e['prefill'].address}:{e['prefill'].port}/standin/faults",
                                json={"fail_kv_pulls": True},
                                headers={"Authorization": f"Bearer {e['prefill'].engine_key}"})
            assert r.status_code == 200, r.text
        t0, n0 = time.monotonic(), len(seen)
        await lv.wait_async(lambda: raised(lv, "pdx"), 60, "pd_ineffective raised in the deployment's status")
        took = time.monotonic() - t0
        assert set(seen[n0 + 2:]) == {"local"}, seen[n0:]  # served, without remote KV: 0 failed
        assert gauge(lv, "pdx") == 1  # gpuflow_group_degraded{kind="pd_ineffective"}
        out = cli(lv, "status", "pdx")
        assert "pd_ineffective" in out.stdout, out.stdout + out.stderr
        current = describe(lv, deployment_id("pdx"))["current"]
        assert "**degraded** pd_ineffective: decodes: " in current and "served without remote KV" in current, current
        # the pulls resume: the next checks see remote KV again, and it clears
        async with httpx.AsyncClient() as http:
            await http.post(f"http://{e['prefill'].address}:{e['prefill'].port}/standin/faults",
                            json={"fail_kv_pulls": False}, headers={"Authorization": f"Bearer {e['prefill'].engine_key}"})
        t1 = time.monotonic()
        await lv.wait_async(lambda: _cleared(lv, "pdx"), 60, "pd_ineffective cleared")
        print(f"pd_ineffective raised {took:.0f} s after the pulls failed, cleared {time.monotonic() - t1:.0f} s after "
              f"they resumed; {len(seen)} requests, {seen.count('remote')} remote, {seen.count('local')} local")
        assert gauge(lv, "pdx") == 0 and "pd_ineffective" not in cli(lv, "status", "pdx").stdout
        stop.set()
        await task
    finally:
        lv.close()


async def _cleared(lv: Live, name: str) -> bool:
    return not await raised(lv, name)
