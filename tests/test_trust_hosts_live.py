"""Hosts prove who they are (issue 40, H1), on the dev stack (tests/live.py: the Temporal dev server,
a control-plane worker, agent processes with simulated GPUs). Anyone who can reach Temporal can
signal a host workflow, start one, or start an agent with a live host's name; none of it changes an
inventory in the store or takes capacity, and every report refused is counted:

- the probe's H1: h3's agent stopped, a forged hello gives h3 2 x 800 GiB: refused (no credential),
  as are h3's own hello replayed from the history and the same with its GPUs rewritten; the 700 GiB
  deployment stays PENDING, and h3's own agent brings it back READY with its 16 GiB;
- a second agent started with h1's name (its own data dir, the right join token) exits naming the
  refusal, and one started on h1's own data dir exits naming the agent that holds it;
- a host workflow no joined host started (``host/hfake``, READY with 2 x 800 GiB in its input and a
  forged hello) writes nothing to the store and holds no capacity."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request

import pytest
from temporalio.api.enums.v1 import EventType

from contracts.control import CONTROL_QUEUE, HostInput, HostView
from gpuflow import ops
from store import host_credentials, records
from tests.live import FAST, Live, spec, write_inventory

pytestmark = pytest.mark.asyncio
GiB = 2**30
BIG = [{"index": i, "vram_total": 800 * GiB, "name": "Forged 800G"} for i in range(2)]


def forged(name: str, boot: str, **extra) -> dict:
    """The probe's report: 1 TiB of RAM and two GPUs of 800 GiB, sent as `temporal workflow signal` would."""
    return {"name": name, "ram_total": 2**40, "gpus": BIG, "boot": boot, **extra}


def row(lv: Live, name: str):
    return next((w for w in records.workers(lv.engine) if w.name == name), None)


async def view(lv: Live, name: str) -> HostView:
    return await lv.client.get_workflow_handle(f"host/{name}").query("status", result_type=HostView)


async def refused(lv: Live, name: str, boot: str, kind: str, timeout: float = 30) -> HostView:
    """The host workflow's view once it shows the refusal of the report that said ``boot``."""
    got: list[HostView] = []

    async def shown() -> bool:
        got[:] = [await view(lv, name)]
        r = got[0].refusal
        return r is not None and r.boot == boot

    await lv.wait_async(shown, timeout, f"host/{name} shows the refusal of report {boot}")
    assert got[0].refusal.kind == kind, got[0].refusal
    return got[0]


def refusals(lv: Live) -> dict[str, float]:
    """gpuflow_host_reports_refused_total by reason, from the control plane's /metrics."""
    with urllib.request.urlopen(f"http://{lv.stack.metrics['server-0']}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("gpuflow_host_reports_refused_total{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('reason="')[1].split('"')[0]] = float(value)
    return out


async def genuine_hello(lv: Live, name: str) -> dict:
    """The last hello host ``name``'s agent signalled, as anyone reading its history can copy it."""
    hist = await lv.client.get_workflow_handle(f"host/{name}").fetch_history()
    signals = [e.workflow_execution_signaled_event_attributes for e in hist.events
               if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED]
    payload = [s for s in signals if s.signal_name == "hello"][-1].input.payloads[0]
    return (await lv.client.data_converter.decode([payload], [dict]))[0]


async def test_a_forged_hello_changes_no_inventory_and_is_counted(tmp_path):
    lv = await Live(str(tmp_path)).start({"h1": [24], "h3": [16]})
    try:
        await ops.deploy(lv.client, spec("big700", vram_gib=700), FAST)
        await lv.wait(lambda: lv.states("big700") == {"big700-0": "pending"}, 60, "big700 PENDING")
        real = await genuine_hello(lv, "h3")
        lv.stack.kill_host("h3", processes=False)  # h3's agent stops
        await lv.wait(lambda: row(lv, "h3").state == "not_ready", 30, "h3 NOT_READY")
        h3 = lv.client.get_workflow_handle("host/h3")

        await h3.signal("hello", forged("h3", "forged-1"))  # the probe's signal: no credential at all
        await refused(lv, "h3", "forged-1", "unsigned")
        rewritten = {**real, "gpus": BIG, "boot": "forged-2"}  # h3's own signed hello, its GPUs rewritten
        await h3.signal("hello", rewritten)
        await refused(lv, "h3", "forged-2", "mac")
        again = {**real, "auth": {**real["auth"]}}  # h3's own hello, replayed as it was
        await h3.signal("hello", again)
        v = await refused(lv, "h3", real["boot"], "replay")
        assert "replayed" in v.refusal.why and v.state == "not_ready"

        h = row(lv, "h3")  # nothing of any of them reached the store
        assert h.state == "not_ready" and [g["vram_total"] for g in h.gpus] == [16 * GiB] and h.ram_total == 64 * GiB
        assert lv.states("big700") == {"big700-0": "pending"}
        count = refusals(lv)
        assert count.get("unsigned", 0) >= 1 and count.get("mac", 0) >= 1 and count.get("replay", 0) >= 1, count

        lv.add_host("h3", [16])  # h3's own agent returns: its credential (kept in its data dir) says hello
        await lv.wait(lambda: row(lv, "h3").state == "ready", 60, "h3 READY again")
        assert [g["vram_total"] for g in row(lv, "h3").gpus] == [16 * GiB]
        assert lv.states("big700") == {"big700-0": "pending"}  # nothing holds 700 GiB
    finally:
        lv.close()


def second_agent(lv: Live, tmp_path, data_dir: str) -> subprocess.CompletedProcess:
    """`gpuflow agent --name h1` with 2 x 800 GiB, started by a careless operator (the join token and all)."""
    inv = str(tmp_path / "big.yaml")
    write_inventory(inv, [800, 800])
    return subprocess.run([sys.executable, "-m", "gpuflow", "agent", "--name", "h1", "--inventory", inv,
                           "--data-dir", data_dir, "--metrics-address", "off", "--address", lv.stack.temporal.address],
                          env={**os.environ, **lv.join_env()}, capture_output=True, text=True, timeout=120)


async def test_a_second_agent_with_a_live_hosts_name_is_refused(tmp_path):
    lv = await Live(str(tmp_path)).start({"h1": [24]})
    try:
        before = row(lv, "h1")
        joined = host_credentials.known(lv.engine, "h1")
        out = second_agent(lv, tmp_path, str(tmp_path / "elsewhere"))
        assert out.returncode == 2, (out.stdout, out.stderr)
        assert "host h1 is joined with another credential: stop that agent, or run 'gpuflow hosts forget h1'" \
               in out.stderr, out.stderr
        out = second_agent(lv, tmp_path, lv.stack.data_dir)  # h1's own data dir: its folder is held
        assert out.returncode == 2 and "runs on" in out.stderr and "already" in out.stderr, out.stderr
        v = await view(lv, "h1")
        assert v.refusal is not None and v.refusal.kind == "other_credential", v.refusal
        after = row(lv, "h1")
        assert (after.state, after.gpus, after.fingerprint) == ("ready", before.gpus, before.fingerprint)
        assert host_credentials.known(lv.engine, "h1").public == joined.public
        assert refusals(lv).get("other_credential", 0) >= 1
    finally:
        lv.close()


async def test_a_host_workflow_no_joined_host_started_holds_no_capacity(tmp_path):
    lv = await Live(str(tmp_path)).start({"h1": [24]})
    try:
        await ops.deploy(lv.client, spec("big700", vram_gib=700), FAST)
        await lv.wait(lambda: lv.states("big700") == {"big700-0": "pending"}, 60, "big700 PENDING")
        fake = HostInput.model_validate({"name": "hfake", "timings": FAST.model_dump(), "state": "ready",
                                         "report": forged("hfake", "in-input")})
        h = await lv.client.start_workflow("HostWorkflow", fake, id="host/hfake", task_queue=CONTROL_QUEUE,
                                           start_signal="hello", start_signal_args=[forged("hfake", "forged-3")])
        await refused(lv, "hfake", "forged-3", "unsigned")

        async def watched_nobody() -> bool:  # its READY input sent a watch to hfake's queue, which nobody polls
            hist = await h.fetch_history()
            return any(e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT for e in hist.events)

        await lv.wait_async(watched_nobody, 60, "hfake's watch timed out")
        await ops.deploy(lv.client, spec("small", vram_gib=10), FAST)  # placement goes on, on h1 only
        await lv.wait(lambda: lv.states("small") == {"small-0": "running"}, 60, "small RUNNING")
        assert {i.worker for i in lv.instances("small")} == {"h1"}
        assert row(lv, "hfake") is None and host_credentials.known(lv.engine, "hfake") is None
        assert lv.states("big700") == {"big700-0": "pending"}
        await h.terminate("test over")
    finally:
        lv.close()
