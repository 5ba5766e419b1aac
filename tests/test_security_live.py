"""What a deployer may ask of a GPU host, end to end: a real control plane and real agents started
WITHOUT --allow-custom, engines replaced by a stand-in launcher (a shell script, as many engine
wrappers are, that runs a Python server recording its argv and environment). A spec's env cannot
run code there, an agent refuses flags that run the model's code unless its operator allowed
them, and names and workflow ids that arrive through Temporal are checked before any host hears
them. No marker file may appear, no file outside the agent's folders may change."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest
import yaml
from temporalio.client import WorkflowFailureError

from contracts.control import CONTROL_QUEUE, DeploymentInput, HostInput, InstanceInput
from gpuflow import ops
from scheduler.spec import ModelSpec
from tests.live import FAST, Live, cli, write_inventory
from worker_agent.processes import pid_alive

SERVER = """import http.server, json, os, sys
args = sys.argv[1:]
if args[:1] == ["-c"]:  # the agent asking this Python whether it has sglang (worker_agent/capabilities.py): yes
    sys.exit(0)
with open({out!r} + "/" + os.environ["STAND_IN_NAME"] + ".json", "w") as f:
    json.dump({{"argv": args, "env": dict(os.environ)}}, f)
port = int(args[args.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""
# a launcher script: bash reads BASH_ENV, and `basename` is looked up on PATH
LAUNCHER = """#!/bin/bash
STAND_IN_NAME="$(basename "$0")" exec {python} {server} "$@"
"""


def launchers(tmp_path, *names: str) -> list[str]:
    server = tmp_path / "server.py"
    server.write_text(SERVER.format(out=str(tmp_path)))
    out = []
    for name in names:
        p = tmp_path / "bin" / name
        p.parent.mkdir(exist_ok=True)
        p.write_text(LAUNCHER.format(python=sys.executable, server=server))
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
        out.append(str(p))
    return out


def attacks(tmp_path) -> dict[str, str]:
    """One env variable per way of running code, each making its own marker file. Only BASH_ENV
    needs nothing on the host (bash expands $(...) in it); the others point at files, which a
    deployer can get onto a host through a model repository."""
    marks = tmp_path / "marks"
    marks.mkdir()
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"open({str(marks / 'PYTHONPATH')!r}, 'w').close()\n")
    (site / "startup.py").write_text(f"open({str(marks / 'PYTHONSTARTUP')!r}, 'w').close()\n")
    evil_bin = tmp_path / "evil-bin"
    evil_bin.mkdir()
    (evil_bin / "basename").write_text(f"#!/bin/sh\ntouch {marks / 'PATH'}\necho sglang\n")
    (evil_bin / "basename").chmod(0o755)
    return {"LD_PRELOAD": str(tmp_path / "missing-evil.so"), "PYTHONPATH": str(site),
            "PYTHONSTARTUP": str(site / "startup.py"), "BASH_ENV": f"$(touch {marks / 'BASH_ENV'})",
            "PATH": f"{evil_bin}:/usr/bin:/bin"}


def sglang_spec(name: str, **kw) -> dict:
    return {"name": name, "source": {"local_path": f"/models/{name}"}, "backend": "sglang",
            "resources": {"vram": "4 GiB"}, **kw}


async def start(tmp_path, hosts: dict[str, list[str]], env: dict[str, str] | None = None) -> Live:
    """A stack whose agents run without --allow-custom, each with its own extra flags."""
    lv = Live(str(tmp_path), env=env)
    lv.stack.start_temporal()
    lv.stack.start_server()
    for name, extra in hosts.items():
        inv = write_inventory(str(tmp_path / f"{name}.yaml"), [24, 24])
        lv.stack.start_agent(name, inv, extra=extra, allow_custom=False)
    from store import records
    from gpuflow.runtime import connect
    from gpuflow.settings import TemporalSettings

    lv.client = await connect(TemporalSettings(address=lv.stack.temporal.address), wait_s=20)
    await lv.wait(lambda: len([w for w in records.workers(lv.engine) if w.state == "ready"]) == len(hosts), 60,
                  "every host READY")
    return lv


async def failure(handle) -> str:
    """The message a workflow failed with (it must fail)."""
    import asyncio

    with pytest.raises(WorkflowFailureError) as e:
        await asyncio.wait_for(handle.result(), 60)
    c = e.value.cause
    return getattr(c, "message", None) or str(c)


async def test_a_specs_env_cannot_run_code_on_a_host(tmp_path):
    """Each variable alone: `gpuflow deploy` refuses it by name; the same spec started straight
    through the Temporal client fails its workflow by name; nothing ran. A spec with an allowed
    knob runs, and its engine sees only the clean environment: none of the agent's own variables."""
    (sglang,) = launchers(tmp_path, "sglang")
    bad = attacks(tmp_path)
    lv = await start(tmp_path, {"g1": ["--sglang-python", sglang]}, env={"GPUFLOW_TEST_AGENT_SECRET": "s3cr3t"})
    try:
        for var, value in bad.items():
            path = tmp_path / f"{var}.yaml"
            path.write_text(yaml.safe_dump(sglang_spec("evil", env={var: value})))
            out = cli(lv, "deploy", str(path))
            assert out.returncode == 2 and f"env {var} " in out.stderr, (var, out.stdout, out.stderr)
        h = await lv.client.start_workflow("ModelDeploymentWorkflow",
                                           DeploymentInput(spec=sglang_spec("evil", env=bad)),
                                           id="deployment/evil", task_queue=CONTROL_QUEUE)
        why = await failure(h)
        assert all(f"env {var} " in why for var in bad), why
        # the same launcher, with a knob the allowlist has: it runs, so the refusals above were the spec's
        good = ModelSpec.model_validate(sglang_spec("good", env={"OMP_NUM_THREADS": "3"}))
        await ops.deploy(lv.client, good, FAST)
        await lv.wait(lambda: lv.states("good") == {"good-0": "running"}, 90, "good RUNNING")
        seen = json.loads((tmp_path / "sglang.json").read_text())
        assert seen["env"]["OMP_NUM_THREADS"] == "3" and seen["env"]["CUDA_VISIBLE_DEVICES"] in ("0", "1")
        assert "GPUFLOW_TEST_AGENT_SECRET" not in seen["env"]  # the agent's environment stays the agent's
        assert not [k for k in seen["env"] if k.startswith("GPUFLOW_") or (k in bad and k != "PATH")]
        assert seen["argv"][:4] == ["-m", "sglang.launch_server", "--model-path", "/models/good"]
        assert lv.states("evil") == {}  # no instance of the refused spec was ever made
        assert sorted(os.listdir(tmp_path / "marks")) == []
    finally:
        lv.close()


async def test_remote_code_and_more_env_need_the_agents_permission(tmp_path):
    """--trust-remote-code passes spec validation, and so does MYAPP_MODE once the control plane's
    operator allowed MYAPP_* (GPUFLOW_ALLOW_ENV); whether they may run is each host's call. On an
    agent without --allow-remote-code and --allow-env the instance is ERROR naming the flag, the
    variable and the options, with no restart loop and nothing launched; on an agent started with
    them, the engine gets both."""
    (vllm,) = launchers(tmp_path, "vllm")
    lv = await start(tmp_path, {"plain": ["--vllm", vllm, "--label", "code=no"],
                                "trusting": ["--vllm", vllm, "--label", "code=yes", "--allow-remote-code",
                                             "--allow-env", "MYAPP_*"]},
                     env={"GPUFLOW_ALLOW_ENV": '["MYAPP_*"]'})
    try:
        def vllm_spec(name: str, code: str) -> ModelSpec:
            return ModelSpec.model_validate({"name": name, "source": {"local_path": f"/models/{name}"},
                                             "backend": "vllm", "resources": {"vram": "4 GiB"},
                                             "backend_parameters": ["--trust_remote_code"],
                                             "env": {"MYAPP_MODE": "fast"},
                                             "worker_selector": {"code": code}},
                                            context={"allow_env": ["MYAPP_*"]})  # as a CLI with the setting

        await ops.deploy(lv.client, vllm_spec("refused", "no"), FAST)
        await lv.wait(lambda: any("--allow-remote-code" in i.reason for i in lv.instances("refused")), 60,
                      "ERROR naming the agent option")
        row = lv.instances("refused")[0]
        assert row.state == "error" and "refused by plain" in row.reason
        assert "--trust_remote_code" in row.reason and "env MYAPP_MODE is not allowed" in row.reason
        assert not (tmp_path / "vllm.json").exists()  # nothing was started
        await ops.deploy(lv.client, vllm_spec("allowed", "yes"), FAST)
        await lv.wait(lambda: lv.states("allowed") == {"allowed-0": "running"}, 90, "allowed RUNNING")
        seen = json.loads((tmp_path / "vllm.json").read_text())
        assert "--trust_remote_code" in seen["argv"] and seen["env"]["MYAPP_MODE"] == "fast"
        row = lv.instances("refused")[0]
        assert (row.state, row.restarts, row.worker) == ("error", 0, None)  # not retried; its GPUs released
    finally:
        lv.close()


async def test_names_and_ids_from_temporal_are_checked(tmp_path):
    """Workflows started through the Temporal client with names that climb out of the agent's
    folders, or with an id that is not their spec's, fail at once naming what is wrong; no file
    outside the agent's folders is written or deleted, and the legitimate deployment keeps running."""
    (sglang,) = launchers(tmp_path, "sglang")
    lv = await start(tmp_path, {"g1": ["--sglang-python", sglang]})
    data = lv.stack.data_dir
    victim = os.path.join(data, "victim.json")  # where agent/g1/run/../../../victim.json lands
    with open(victim, "w") as f:
        f.write("keep")
    try:
        legit = ModelSpec.model_validate(sglang_spec("legit"))
        await ops.deploy(lv.client, legit, FAST)
        await lv.wait(lambda: lv.states("legit") == {"legit-0": "running"}, 90, "legit RUNNING")
        pid = lv.instances("legit")[0].pid
        raw = legit.model_dump(mode="json", exclude_none=True)

        h = await lv.client.start_workflow("ModelDeploymentWorkflow", DeploymentInput(spec=raw, timings=FAST),
                                           id="deployment/impostor", task_queue=CONTROL_QUEUE)
        why = await failure(h)
        assert "deployment/impostor" in why and "'legit'" in why, why
        out = cli(lv, "delete", "impostor")
        assert out.returncode == 2, out.stdout

        cases = [
            ("ModelInstanceWorkflow", "instance/../../../victim",
             InstanceInput.model_construct(name="../../../victim", deployment="legit", spec=raw, timings=FAST),
             "'../../../victim'"),
            ("ModelInstanceWorkflow", "instance/legit-7",  # a good name under another deployment's spec
             InstanceInput(name="legit-7", deployment="other", spec=raw, timings=FAST), "'other'"),
            ("ModelInstanceWorkflow", "instance/decoy", InstanceInput(name="legit-8", deployment="legit", spec=raw,
                                                                      timings=FAST), "'instance/decoy'"),
            ("ModelDeploymentWorkflow", "deployment/legit2",  # adopting names it does not own
             DeploymentInput.model_construct(spec={**raw, "name": "legit2"}, instances=["../../../victim"]),
             "'../../../victim'"),
            ("ModelDeploymentWorkflow", "deployment/legit3",
             DeploymentInput(spec={**raw, "name": "legit3"}, instances=["legit-0"]), "'legit-0'"),
            ("HostWorkflow", "host/../../victim", HostInput.model_construct(name="../../victim"), "'../../victim'"),
            ("HostWorkflow", "host/g9", HostInput(name="g1"), "'host/g9'"),
        ]
        for wf, wid, inp, named in cases:
            h = await lv.client.start_workflow(wf, inp, id=wid, task_queue=CONTROL_QUEUE)
            why = await failure(h)
            assert named in why, (wid, why)
        assert lv.states("legit") == {"legit-0": "running"} and pid_alive(pid)  # untouched by all of it
        with open(victim) as f:
            assert f.read() == "keep"
        assert sorted(f for f in os.listdir(data) if f.startswith("victim")) == ["victim.json"]
    finally:
        lv.close()
