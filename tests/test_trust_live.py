"""Trust at every entry, on the dev stack (the Temporal dev server, a control-plane worker and agent
processes with simulated GPUs): what a deployer, a careless operator or anyone who can reach
Temporal sends is checked where it arrives, and one bad object never stops the rest.

- a ghost instance (a placement in a workflow's input, or the agent's launch activity called from
  a workflow of one's own) starts no engine, and a legitimate deployment on the same GPU runs alone;
- an agent with a broken inventory does not start, a host whose report does not validate is
  NOT_READY with the reason, and placement goes on everywhere else;
- a NUL byte in a path is refused at deploy, exit 2."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from datetime import timedelta

import pytest
import yaml
from temporalio import workflow
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ActivityError
from sqlmodel import Session
from temporalio.worker import Worker

from contracts.control import CONTROL_QUEUE, InstanceInput, PlacementPlan
from store import records
from store.tables import WorkerRow
from gpuflow import ops
from scheduler.cluster import Claim
from tests.live import FAST, Live, cli, spec
from contracts import agent as hp
from worker_agent.processes import pid_alive

pytestmark = pytest.mark.asyncio


def marking(marks: str, name: str) -> str:
    """A custom command that leaves a file named for its instance, then serves HTTP: whether it
    ever started is on disk, whatever became of it."""
    code = (f"import http.server,sys; open({marks!r}+'/{name}','w').close(); "
            "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), http.server.SimpleHTTPRequestHandler).serve_forever()")
    return f"python3 -c {subprocess.list2cmdline([code])} {{port}}"


@workflow.defn(name="GhostLaunch", sandboxed=False)
class GhostLaunch:
    """Somebody's own workflow, on somebody's own worker, that schedules the agent's launch
    activity on a host's queue: the way to call an agent's activity without the control plane."""

    @workflow.run
    async def run(self, args: list) -> str:
        host, req = args
        try:
            await workflow.execute_activity(hp.LAUNCH_INSTANCE, req, task_queue=f"gpuflow-host-{host}",
                                            start_to_close_timeout=timedelta(seconds=30))
        except ActivityError as e:
            return f"{getattr(e.cause, 'type', '')}: {getattr(e.cause, 'message', e.cause)}"
        return "launched"


async def test_a_ghost_launches_nothing_and_the_booked_replica_runs_alone(tmp_path):
    marks = str(tmp_path / "marks")
    os.mkdir(marks)
    lv = await Live(str(tmp_path)).start({"h1": [24]})
    try:
        ghost = spec("ghost", vram_gib=20, command=marking(marks, "ghost")).model_dump(mode="json", exclude_none=True)
        plan = PlacementPlan(worker="h1", gpu_indexes=[0], claim=Claim(ram=2**30, vram={0: 20 * 2**30}))
        # 1. an instance workflow started with a placement in its input: refused before any host hears of it
        h = await lv.client.start_workflow("ModelInstanceWorkflow",
                                           InstanceInput(name="ghost-0", deployment="ghost", spec=ghost, timings=FAST,
                                                         placement=plan),
                                           id="instance/ghost-0", task_queue=CONTROL_QUEUE)
        with pytest.raises(WorkflowFailureError) as e:
            await asyncio.wait_for(h.result(), 30)
        assert "may not bring a placement" in str(e.value.cause), e.value.cause
        # 2. the agent's launch activity, scheduled by a workflow of one's own on the host's queue
        req = hp.LaunchRequest(instance="ghost-0", model="ghost", backend="custom", gpu_indexes=[0],
                               run_command=marking(marks, "ghost"), ready_timeout_s=10, settle_s=0.5)
        queue = f"ghost-{uuid.uuid4().hex[:8]}"
        async with Worker(lv.client, task_queue=queue, workflows=[GhostLaunch]):
            said = await lv.client.execute_workflow("GhostLaunch", ["h1", req], id=f"ghost/{queue}", task_queue=queue)
        assert said.startswith("NotBooked: no booking in the ledger for instance ghost-0 on host h1"), said
        # 3. the legitimate replica, booked on the same GPU, runs; no ghost process ever started
        await ops.deploy(lv.client, spec("legit", vram_gib=20, command=marking(marks, "legit")), FAST)
        await lv.wait(lambda: lv.states("legit") == {"legit-0": "running"}, 60, "legit RUNNING")
        assert sorted(os.listdir(marks)) == ["legit"]
        row = lv.instances("legit")[0]
        assert (row.worker, row.gpu_indexes) == ("h1", [0]) and pid_alive(row.pid)
        assert lv.states("ghost") == {}  # listed nowhere, booked nowhere
    finally:
        lv.close()


BAD_GPUS = [{"index": 0, "vram_total": "24 GiB"}, {"index": 0, "vram_total": "24 GiB"}]


async def test_one_bad_host_never_stops_placement_elsewhere(tmp_path):
    lv = await Live(str(tmp_path)).start({"h1": [24]})
    try:
        # an agent whose inventory repeats a GPU index does not start, naming the field and the problem
        inv = tmp_path / "bad.yaml"
        inv.write_text(yaml.safe_dump({"ram_total": "64 GiB", "gpus": BAD_GPUS}))
        out = subprocess.run([sys.executable, "-m", "gpuflow", "agent", "--name", "bad", "--inventory", str(inv),
                              "--address", lv.stack.temporal.address, "--data-dir", str(tmp_path / "bad-agent")],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "gpus" in out.stderr and "GPU index 0 appears twice" in out.stderr, out.stderr
        # a report that does not validate, signed with the host's own credential (an agent of another
        # version's, say: an unsigned one changes nothing, tests/test_trust_hosts_live.py), sent straight
        # through Temporal
        from worker_agent.credential import open_credential

        cred = open_credential(str(tmp_path / "bad-credential"), "bad", lv.stack.join_token())
        report = cred.signed({"name": "bad", "ram_total": 64 * 2**30, "gpus": BAD_GPUS}, "hello",
                             str(int(time.time() * 1000)))
        cred.close()
        await lv.client.start_workflow("HostWorkflow", {"name": "bad", "timings": FAST.model_dump()}, id="host/bad",
                                       task_queue=CONTROL_QUEUE, start_signal="hello", start_signal_args=[report])
        # a row an older gpuflow wrote for another host, which no longer validates
        with Session(lv.engine) as s:
            s.add(WorkerRow(name="old", state="ready", ram_total=64 * 2**30,
                            gpus=[{"index": 0, "vram_total": 24 * 2**30}, {"index": 0, "vram_total": 24 * 2**30}]))
            s.commit()

        async def bad_host() -> dict:  # {} until the listing (Temporal's visibility) shows it
            return next((h.model_dump() for h in await ops.hosts(lv.client) if h.name == "bad"), {})

        for _ in range(150):
            view = await bad_host()
            if view.get("reason"):
                break
            await asyncio.sleep(0.2)
        assert view["state"] == "not_ready" and "GPU index 0 appears twice" in view["reason"], view
        listed = cli(lv, "hosts")
        assert "NOT_READY" in listed.stdout and "appears twice" in listed.stdout, listed.stdout
        # placement goes on: a new deployment lands on the good host, deletes finish
        await ops.deploy(lv.client, spec("m", vram_gib=10, replicas=2), FAST)
        await lv.wait(lambda: lv.states("m") == {"m-0": "running", "m-1": "running"}, 60, "m RUNNING on h1")
        assert {i.worker for i in lv.instances("m")} == {"h1"}
        out = cli(lv, "delete", "m", "--wait")
        assert out.returncode == 0, out.stderr
        # `hosts` and `hosts forget` agree: NOT_READY, so it may be forgotten
        out = cli(lv, "hosts", "forget", "bad")
        assert out.returncode == 0, (out.stdout, out.stderr)
    finally:
        lv.close()


async def test_a_nul_in_a_path_is_refused_at_deploy(tmp_path):
    lv = await Live(str(tmp_path)).start({"h1": [24]})
    try:
        raw = spec("nul").model_dump(mode="json", exclude_none=True)
        raw["source"] = {"local_path": "/models/a\x00b"}
        path = tmp_path / "nul.yaml"
        path.write_text(yaml.safe_dump(raw))
        out = cli(lv, "deploy", str(path))
        assert out.returncode == 2 and "local_path" in out.stderr and "NUL" in out.stderr, (out.stdout, out.stderr)
        assert lv.states("nul") == {}
    finally:
        lv.close()


async def test_tenant_bs_key_gets_404_on_tenant_as_model(tmp_path):
    """Keys of two tenants through the dev stack's gateway, with the official client: each key
    reaches its own tenant's model; the other's is a 404 exactly as for a model that does not
    exist, listing only the key's own."""
    import openai

    from store import keys, tenants
    from gpuflow.ports import server_port
    from scheduler.tenancy.config import TenantsFile

    lv = await Live(str(tmp_path)).start({"h1": [24, 24]})
    try:
        tenants.apply(lv.engine, TenantsFile.model_validate({"tenants": [{"name": "a"}, {"name": "b"}]}))
        await ops.deploy(lv.client, spec("a-chat", vram_gib=10, tenant="a"), FAST)
        await ops.deploy(lv.client, spec("b-chat", vram_gib=10, tenant="b"), FAST)
        await lv.wait(lambda: lv.states("a-chat") == {"a-chat-0": "running"}
                      and lv.states("b-chat") == {"b-chat-0": "running"}, 60, "both RUNNING")
        key_a, _ = keys.create(lv.engine, "a")
        key_b, _ = keys.create(lv.engine, "b")
        base = lv.stack.start_gateway(server_port())
        a = openai.AsyncOpenAI(base_url=base, api_key=key_a, max_retries=0, timeout=30)
        b = openai.AsyncOpenAI(base_url=base, api_key=key_b, max_retries=0, timeout=30)
        try:
            async def models(c) -> list[str]:
                for _ in range(50):  # the gateway reads the routing table every 0.5 s
                    got = sorted(m.id for m in (await c.models.list()).data)
                    if got:
                        return got
                    await asyncio.sleep(0.2)
                return []

            assert await models(a) == ["a-chat"] and await models(b) == ["b-chat"]
            with pytest.raises(openai.APIStatusError) as own:  # http.server stands in: it answers POST with 501
                await a.completions.create(model="a-chat", prompt="hi", max_tokens=1)
            assert own.value.status_code == 501  # the request reached a-chat's engine
            with pytest.raises(openai.NotFoundError) as forbidden:
                await b.completions.create(model="a-chat", prompt="hi", max_tokens=1)
            with pytest.raises(openai.NotFoundError) as unknown:
                await b.completions.create(model="no-such-model", prompt="hi", max_tokens=1)
            said = forbidden.value.response.json()["error"]["message"]
            assert said == unknown.value.response.json()["error"]["message"].replace("no-such-model", "a-chat"), said
            assert "b-chat" in said and "a-chat" not in said.replace("'a-chat'", "")
        finally:
            await a.close()
            await b.close()
    finally:
        lv.close()


PROBE_FLAGS = [
    (["--lora-modules", '{"name": "x", "path": "/outside"}'], "/outside"),  # a file inside JSON
    (["--lora-modules=x=/outside"], "/outside"),  # a file inside k=v
    (["--speculative-config", '{"model": "/outside"}'], "/outside"),
    (["--chat-template", "AGENT_CWD_FILE"], "agent's working folder"),  # relative: the model's folder, never the agent's
    (["--worker-extension-cls", "evil.Ext"], "--allow-remote-code"),  # imports code
    (["--hf-overrides", '{"auto_map": {"AutoConfig": "evil.Cfg"}}'], "--allow-remote-code"),
]


async def test_json_valued_and_import_flags_never_reach_the_engine(tmp_path):
    """A vLLM stand-in (a launcher script that records its argv) on an agent with --model-root and
    without --allow-remote-code: each of the probe's specs is refused at deploy or by the agent,
    naming the problem, and the stand-in never starts. One stack, one deployment per case."""
    from tests.test_security_live import launchers

    (vllm,) = launchers(tmp_path, "vllm")
    root = tmp_path / "models"
    (root / "m").mkdir(parents=True)
    # a file in the agent's working folder (the agents run where this test runs): relative, it
    # would be read there by the engine, whose working folder is the agent's
    here = sorted(f for f in os.listdir(".") if os.path.isfile(f))[0]
    lv = Live(str(tmp_path))
    try:
        await lv.start({"g1": [24]}, agent_args=["--vllm", vllm, "--model-root", str(root)])
        for n, (params, named) in enumerate(PROBE_FLAGS):
            params = [here if p == "AGENT_CWD_FILE" else p for p in params]
            raw = {"name": f"m{n}", "source": {"local_path": str(root / "m")}, "backend": "vllm",
                   "resources": {"vram": "4 GiB"}, "backend_parameters": params}
            path = tmp_path / f"m{n}.yaml"
            path.write_text(yaml.safe_dump(raw))
            out = cli(lv, "deploy", str(path))
            if out.returncode == 0:  # not refusable without a host: the agent refuses it
                await lv.wait(lambda: any(i.state == "error" for i in lv.instances(f"m{n}")), 60, f"m{n} ERROR")
                why = lv.instances(f"m{n}")[0].reason
                assert "refused by g1" in why and named in why, (params, why)
            else:
                assert out.returncode == 2 and named in out.stderr, (params, out.stdout, out.stderr)
        assert not (tmp_path / "vllm.json").exists()  # the stand-in never started
    finally:
        lv.close()
