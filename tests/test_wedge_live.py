"""One bad input must not wedge the cluster: workflow inputs sent straight through the Temporal
client (as the Temporal CLI or any SDK can) fail their workflow at once with the reason, while
a healthy deployment keeps running and ``gpuflow status`` / ``hosts`` keep answering."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError

from contracts.control import CONTROL_QUEUE
from gpuflow import ops
from tests.live import FAST, Live, cli, spec

GOOD = spec("x", vram_gib=1).model_dump(mode="json", exclude_none=True)
ENGINES = ["--llama-cpp-python", sys.executable, "--vllm", "/bin/true"]


def _with(**kw) -> dict:
    return {"spec": {**GOOD, **kw.pop("spec", {})}, "timings": FAST.model_dump(), **kw}


# (workflow type, input (a tuple: the arguments), what the failure names)
WEDGES = [
    ("ModelDeploymentWorkflow", ({**_with(), "replicas": "many"},), "replicas"),
    ("ModelDeploymentWorkflow", ([1, 2],), "got a list"),
    ("ModelDeploymentWorkflow", (None,), "got null"),
    ("ModelDeploymentWorkflow", ("deploy me",), "got a string"),
    ("ModelDeploymentWorkflow", (), "takes one input"),
    ("ModelDeploymentWorkflow", (_with(), _with()), "got 2"),
    ("ModelDeploymentWorkflow", (_with(spec={"replicas": 100000}),), "replicas"),
    ("ModelDeploymentWorkflow", ({**_with(), "replicas": 100000},), "replicas"),
    ("ModelDeploymentWorkflow", ({**_with(), "timings": {"reconcile_s": 1e300}},), "reconcile_s"),
    ("ModelDeploymentWorkflow", (_with(spec={"resources": {"vram": 2**80}}),), "vram"),
    ("ModelDeploymentWorkflow", ({**_with(), "replicas": 300},), "maximum of 256"),
    ("ModelDeploymentWorkflow", (_with(spec={"run_command": "python3 -c 'print(1)"}),), "run_command"),
    ("ModelDeploymentWorkflow", (_with(spec={"rollout": {"max_surge": -1}}),), "rollout.max_surge"),
    ("ModelDeploymentWorkflow", ({**_with(), "rollout": {"versions": "x"}},), "rollout.versions"),  # the carried state is typed: named by its path
    ("ModelDeploymentWorkflow", ({**_with(), "rollout": {"good": {"name": "x"}}},), "rollout: source"),
    ("ModelInstanceWorkflow", ({"name": "i", "deployment": "d", "spec": GOOD, "restarts": "x"},), "restarts"),
    ("ModelInstanceWorkflow", ([],), "got a list"),
    ("HostWorkflow", ({"name": "h9", "report": {"name": "h9", "ram_total": "lots"}},), "ram_total"),
    ("HostWorkflow", (7,), "got a int"),
    ("HostWorkflow", ({"name": "h9", "report": {"name": "h9", "ram_total": 2**70}},), "ram_total"),
    ("HostWorkflow", ({"name": "h9", "report": {"name": "h9", "ram_total": 1, "gpus": [
        {"index": 2**40, "vram_total": 1}]}},), "index"),
]


async def _failure(lv: Live, wtype: str, args: tuple, wid: str, within: float = 30) -> str:
    """The failure message of a workflow started with ``args``; fails the test if it is still
    Running after ``within`` seconds or its history shows a failed workflow task."""
    h = await lv.client.start_workflow(wtype, args=list(args), id=wid, task_queue=CONTROL_QUEUE)
    try:
        await asyncio.wait_for(h.result(), within)
    except WorkflowFailureError as e:
        return str(e.cause)
    except asyncio.TimeoutError:
        hist = await h.fetch_history()
        failed = [e for e in hist.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
        await h.terminate("test: wedged")
        raise AssertionError(f"{wid} still Running after {within} s ({len(failed)} workflow task failures)")
    raise AssertionError(f"{wid} completed with input {args!r}")


@pytest.fixture(scope="module")
async def stack(tmp_path_factory):
    # the hosts run llama.cpp (this Python's llama-cpp-python) and "vllm" (a program that is there), so
    # the backend filter keeps them and the spec faults below are found where they are
    lv = await Live(str(tmp_path_factory.mktemp("wedge"))).start({"h1": [24]}, agent_args=ENGINES)
    await ops.deploy(lv.client, spec("good", vram_gib=4), FAST)
    await lv.wait(lambda: lv.states("good") == {"good-0": "running"}, 90, "good RUNNING")
    yield lv
    lv.close()


async def test_wedging_inputs_fail_at_once_and_status_keeps_answering(stack):
    lv = stack
    for n, (wtype, args, named) in enumerate(WEDGES):
        prefix = {"ModelDeploymentWorkflow": "deployment", "ModelInstanceWorkflow": "instance",
                  "HostWorkflow": "host"}[wtype]
        if wtype == "ModelDeploymentWorkflow" and args and isinstance(args[0], dict) and isinstance(args[0].get("spec"), dict):
            # the id must match the spec's name (workflows/guards.py), or that is what fails first
            args = ({**args[0], "spec": {**args[0]["spec"], "name": f"wedge{n}"}},) + args[1:]
        msg = await _failure(lv, wtype, args, f"{prefix}/wedge{n}")
        assert named in msg, (wtype, args, msg)
    out = cli(lv, "status", "wedge0")  # the CLI says why a refused deployment failed
    assert out.returncode == 2 and "deployment 'wedge0' failed" in out.stderr and "replicas" in out.stderr, out.stderr
    out = cli(lv, "status", "--json")
    assert out.returncode == 0, out.stderr
    st_ = json.loads(out.stdout)
    assert [d["name"] for d in st_["deployments"]] == ["good"]
    assert st_["deployments"][0]["instances"][0]["state"] == "running"
    assert "h1" in [h["name"] for h in st_["hosts"]]
    assert lv.states("good") == {"good-0": "running"}


async def test_status_hosts_and_delete_carry_on_past_a_broken_deployment(stack):
    """A deployment nobody runs (started on a task queue no worker polls, as a typo in
    `temporal workflow start --task-queue` does) never answers: status shows it BROKEN and the
    healthy one as it is; delete ends it at once instead of waiting on an update forever."""
    lv = stack
    await lv.client.start_workflow("ModelDeploymentWorkflow", _with(), id="deployment/nobody",
                                   task_queue="gpuflow-contrl")
    out = cli(lv, "status")
    assert out.returncode == 0, out.stderr
    assert "deployment nobody: BROKEN" in out.stdout and "good-0" in out.stdout, out.stdout
    out = cli(lv, "status", "--json")
    rows = {d["name"]: d for d in json.loads(out.stdout)["deployments"]}
    assert rows["good"]["instances"][0]["state"] == "running" and "task queue 'gpuflow-contrl'" in rows["nobody"]["broken"]
    await lv.client.start_workflow("HostWorkflow", {"name": "ghost"}, id="host/ghost", task_queue="elsewhere")
    out = cli(lv, "hosts")
    assert out.returncode == 0, out.stderr
    assert "h1" in out.stdout and "ghost" in out.stdout and "BROKEN" in out.stdout, out.stdout
    assert "task queue 'elsewhere'" in out.stdout, out.stdout
    await lv.client.get_workflow_handle("host/ghost").terminate("test over")
    started = time.monotonic()
    out = cli(lv, "delete", "nobody")
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - started < 40
    out = cli(lv, "status", "--json")
    assert [d["name"] for d in json.loads(out.stdout)["deployments"]] == ["good"]


async def test_counts_past_the_limits_are_refused_by_the_cli_and_by_the_workflow(stack, tmp_path):
    """replicas past the ceiling (4096) or the operator's maximum (256 by default) are refused
    with the field named: by the CLI, and by the deployment itself when a client sends them
    straight through Temporal (the scale validator, the update handlers)."""
    from temporalio.client import WorkflowUpdateFailedError

    lv = stack
    big = tmp_path / "big.yaml"
    big.write_text(json.dumps({**GOOD, "name": "big", "replicas": 100000}))
    out = cli(lv, "deploy", str(big))
    assert out.returncode == 2 and "replicas" in out.stderr and "4096" in out.stderr, out.stderr
    out = cli(lv, "deploy", str(big), "--replicas", "300")
    assert out.returncode == 2 and "replicas" in out.stderr, out.stderr
    out = cli(lv, "scale", "good", "300")
    assert out.returncode == 2 and "maximum of 256" in out.stderr, out.stderr
    h = lv.client.get_workflow_handle("deployment/good")
    for args, named in [(("scale", 100000), "ceiling of 4096"), (("scale", 300), "maximum of 256"),
                        (("scale", "many"), ""),
                        (("update_spec", {**(await h.query("status"))["spec"], "replicas": 300}), "maximum of 256")]:
        with pytest.raises(WorkflowUpdateFailedError) as e:
            await asyncio.wait_for(h.execute_update(args[0], args[1]), 30)
        assert named in str(e.value.cause), (args, str(e.value.cause))
    view = await h.query("status")
    assert view["replicas"] == 1 and lv.states("good") == {"good-0": "running"}


async def test_the_control_planes_maximum_decides_not_the_clients(stack, tmp_path):
    """GPUFLOW_LIMITS__MAX_REPLICAS is the control plane's setting. A client whose own environment
    says 1 still deploys 2 replicas where the control plane allows 256 (the CLI had refused with its
    own default, naming "this cluster's maximum"), and a refusal by the control plane names where
    the setting lives."""
    lv = stack
    two = tmp_path / "two.yaml"
    two.write_text(json.dumps({**GOOD, "name": "two"}))
    env = {**os.environ, "GPUFLOW_LIMITS__MAX_REPLICAS": "1"}
    out = subprocess.run([sys.executable, "-m", "gpuflow", "deploy", str(two), "--replicas", "2",
                          "--address", lv.stack.temporal.address], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    out = cli(lv, "scale", "two", "257")
    assert out.returncode == 2 and "maximum of 256 (the operator's GPUFLOW_LIMITS__MAX_REPLICAS, set where the " \
        "control-plane workers run)" in out.stderr, out.stderr
    assert cli(lv, "delete", "two", "--wait").returncode == 0


async def test_a_run_command_that_cannot_be_split_is_refused_at_deploy(stack, tmp_path):
    lv = stack
    f = tmp_path / "quote.yaml"
    f.write_text(json.dumps({**GOOD, "name": "quote", "run_command": "python3 -c 'print(1)"}))
    out = cli(lv, "deploy", str(f))
    assert out.returncode == 2 and "run_command" in out.stderr and "No closing quotation" in out.stderr, out.stderr


async def test_a_lying_gguf_header_is_error_with_the_reason_and_delete_returns(stack, tmp_path):
    """block_count 2^32-1 over four layers used to pin a control-plane worker for minutes."""
    from gpuflow.demo import synthetic
    from scheduler.spec import ModelSpec

    lv = stack
    path = synthetic.write_llama_gguf(str(tmp_path / "liar.gguf"), n_layer=4, n_embd=64, n_ff=128, n_head=8,
                                      n_head_kv=2, n_vocab=32, ctx=256, recipe="F16",
                                      header={"llama.block_count": 2**32 - 1})
    await ops.deploy(lv.client, ModelSpec.model_validate(
        {"name": "liar", "source": {"local_path": path}, "backend": "llama.cpp"}), FAST)
    await lv.wait(lambda: lv.states("liar").get("liar-0") == "error", 60, "liar ERROR")
    row = lv.instances("liar")[0]
    assert "cannot estimate the model" in row.reason and "llama.block_count is 4294967295" in row.reason
    out = cli(lv, "delete", "liar", "--wait")
    assert out.returncode == 0, out.stderr
    assert lv.states("good") == {"good-0": "running"}


async def test_the_agent_refusing_the_spec_is_error_without_restarts_or_replacement(stack, tmp_path):
    """A host whose operator allows models only under one root refuses a path outside it: the
    instance is ERROR with the agent's reason, not "unreachable", and is neither restarted nor
    moved through release and re-placement (its history stays short)."""
    from store import ledger, records
    from scheduler.spec import ModelSpec

    lv = stack
    root = tmp_path / "root"
    root.mkdir()
    lv.add_host("h2", [24], ["--model-root", str(root), "--label", "pool=rooted", *ENGINES])
    await lv.wait(lambda: any(w.name == "h2" and w.state == "ready" for w in records.workers(lv.engine)), 60, "h2 READY")
    await ops.deploy(lv.client, ModelSpec.model_validate({**GOOD, "name": "outside", "worker_selector": {"pool": "rooted"},
                                                          "source": {"local_path": "/models/outside"}}), FAST)
    await lv.wait(lambda: lv.states("outside").get("outside-0") == "error", 60, "outside ERROR")
    await asyncio.sleep(5)  # time enough for several restarts or re-placements, were there any
    row = lv.instances("outside")[0]
    assert row.state == "error" and row.restarts == 0, (row.state, row.restarts, row.reason)
    assert "refused by h2" in row.reason and "outside this host's model roots" in row.reason, row.reason
    assert "unreachable" not in row.reason
    assert not any(k[0] == "h2" for k in ledger.booked_per_gpu(lv.engine))  # its reservation released
    hist = await lv.client.get_workflow_handle("instance/outside-0").fetch_history()
    assert len(hist.events) < 80, len(hist.events)


async def test_a_spec_fault_found_at_decide_is_error_not_a_loop_of_replacements(stack):
    """An engine flag the policy cannot read fails the decision: ERROR with the reason, once.
    (Before, the instance workflow failed, and the deployment replaced it, again and again.)
    Where spec validation already refuses the flag, that refusal names it: either is fine."""
    from pydantic import ValidationError

    from scheduler.spec import ModelSpec

    lv = stack
    raw = {**GOOD, "name": "tp", "backend": "vllm", "backend_parameters": ["--tensor-parallel-size", "two"]}
    raw.pop("run_command")
    try:
        tp = ModelSpec.model_validate(raw)
    except ValidationError as e:
        assert "--tensor-parallel-size" in str(e)
        return
    await ops.deploy(lv.client, tp, FAST)
    await lv.wait(lambda: lv.states("tp").get("tp-0") == "error", 60, "tp-0 ERROR")
    await asyncio.sleep(5)  # replacements would show up by now
    assert lv.states("tp") == {"tp-0": "error"}
    row = lv.instances("tp")[0]
    assert "backend parameter --tensor-parallel-size must be an integer, got 'two'" in row.reason, row.reason
    out = cli(lv, "delete", "tp", "--wait")
    assert out.returncode == 0, out.stderr
