"""A local model path is read on a GPU host (worker_agent/model_header.py) and costed on the
control plane from what the host sent (activities/host_estimate.py), with the same result as
reading the files in place. End to end: a path that only the agent's process can see
(/proc/self/cwd/... resolves against each process's own working directory) is estimated and
served there, and a path no host has leaves the instance PENDING naming it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from temporalio.exceptions import ApplicationError

from activities.host_estimate import request_from_host
from gpuflow import ops
from gpuflow.ports import server_port
from gpuflow.demo.synthetic import llama_like_hf
from scheduler.estimate import estimate_request
from contracts.estimate_inputs import HeaderRequest
from scheduler.spec import ModelSpec
from scheduler.summary import request_summary
from tests.live import FAST, Live, write_inventory
from worker_agent.model_header import ModelHeaders


def gguf_spec(path: str, **kw) -> ModelSpec:
    return ModelSpec.model_validate({"name": "m", "source": {"local_path": path}, "backend": "llama.cpp",
                                     "backend_parameters": ["-c", "2048"], **kw})


def test_host_read_costs_the_same_as_reading_in_place(tmp_path, smollm2, llama3_gguf):
    hf = llama_like_hf(str(tmp_path / "l3"), layers=32, hidden=4096, ff=14336, heads=32, kv_heads=8, vocab=128256,
                       max_pos=8192)
    hf_spec = ModelSpec.model_validate({"name": "h", "source": {"local_path": hf}, "backend": "vllm"})
    reader = ModelHeaders("h1")
    for spec, gguf in [(gguf_spec(smollm2), True),       # the real SmolLM2 GGUF, llama.cpp's memory model
                       (gguf_spec(llama3_gguf), True),   # Llama-3-8B's layout: 128k-token vocabulary, 280k merges
                       (hf_spec, False)]:                # config.json + safetensors headers: weights x 1.2 + 2 GiB
        inputs = reader.read(HeaderRequest(path=spec.source.local_path, gguf=gguf))
        assert len(inputs.model_dump_json()) < 512 * 1024  # well inside a Temporal payload
        assert request_summary(request_from_host(spec, inputs)) == request_summary(estimate_request(spec))


def test_a_directory_sends_parameters_not_its_config_file(tmp_path):
    """A deployer may name any directory: its config.json is parsed on the host and only the
    model parameters travel (a credentials file named config.json stays on the host)."""
    d = tmp_path / "creds"
    d.mkdir()
    (d / "config.json").write_text('{"auths": {"registry": {"auth": "SECRET-TOKEN"}}, "num_hidden_layers": 2}')
    inputs = ModelHeaders("h1").read(HeaderRequest(path=str(d), gguf=False))
    assert "SECRET" not in inputs.model_dump_json() and inputs.params.num_layers == 2


def test_reads_are_cached_per_mtime_and_refused_outside_the_roots(tmp_path, smollm2):
    root = tmp_path / "models"
    root.mkdir()
    local = root / "smol.gguf"
    local.write_bytes(open(smollm2, "rb").read())
    reader = ModelHeaders("h1", (str(root),))
    req = HeaderRequest(path=str(local), gguf=True)
    first = reader.read(req)
    assert reader.read(req) is first  # same path, mtime and size: not read again
    os.utime(local, ns=(first.mtime_ns + 10**9, first.mtime_ns + 10**9))
    assert reader.read(req) is not first
    (root / "bad.gguf").write_bytes(b"GGML" + b"\0" * 64)
    for path, kind, words in [(str(tmp_path / "models" / "nope.gguf"), "ModelPathMissing", "is not on host h1"),
                              (smollm2, "ModelPathRefused", "outside this host's model roots"),
                              (str(root / "bad.gguf"), "ModelError", "bad.gguf")]:
        with pytest.raises(ApplicationError) as e:
            reader.read(HeaderRequest(path=path, gguf=True))
        assert (e.value.type, e.value.non_retryable) == (kind, True) and words in e.value.message, e.value.message


def agent_in(lv: Live, name: str, cwd: str, *extra: str) -> None:
    """An agent whose working directory is ``cwd``: /proc/self/cwd/... names a file only it (and
    the engines it starts) can see, as a GPU host's local disk is for the control plane."""
    inv = write_inventory(os.path.join(lv.tmp, f"{name}.yaml"), [24])
    with open(os.path.join(lv.stack.log_dir, f"agent-{name}.log"), "ab") as out:
        lv.stack.agents[name] = subprocess.Popen(
            [sys.executable, "-m", "gpuflow", "agent", "--name", name, "--inventory", inv, "--allow-custom",
             "--metrics-address", f"127.0.0.1:{server_port()}", *extra], env=lv.stack.env, cwd=cwd, stdout=out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


async def test_a_path_only_the_gpu_host_has_is_estimated_and_served_there(tmp_path, smollm2):
    """'far' cannot see the path: the model is PENDING naming it and far's answer. 'near' joins
    with the file in its working directory: its agent reads the header, the control plane costs
    it, the local-path filter leaves far out (its agent looked), and llama-cpp-python serves it
    on near. Before, the control plane read the path itself and the instance was ERROR."""
    path = "/proc/self/cwd/models/smol.gguf"
    assert not os.path.exists(path)  # not here (the test's and the control plane's directory)
    lv = await Live(str(tmp_path)).start({"far": [24]}, agent_args=["--llama-cpp-python", sys.executable])
    try:
        await ops.deploy(lv.client, gguf_spec(path, name="smol", backend_parameters=["-c", "512"]), FAST)
        why = f"model path '{path}' is on no host that could run it: far: model path {path} is not on host far"
        await lv.wait(lambda: any(why in i.reason for i in lv.instances("smol")), 60, "PENDING naming the path")
        assert lv.states("smol") == {"smol-0": "pending"}

        near = tmp_path / "near"
        (near / "models").mkdir(parents=True)
        os.symlink(smollm2, near / "models" / "smol.gguf")
        agent_in(lv, "near", str(near), "--llama-cpp-python", sys.executable)
        await lv.wait(lambda: lv.states("smol") == {"smol-0": "running"}, 120, "RUNNING on near")
        row = lv.instances("smol")[0]
        assert row.worker == "near"
        view = await ops.instance(lv.client, "smol-0")
        summary = view.decision.request
        assert summary.kind == "gguf" and summary.layers == 31  # 30 blocks + output, from near's read
        local = next(f for f in view.decision.filters if f.filter == "local_path")
        assert [r.model_dump() for r in local.removed] == [{"worker": "far", "reasons": [
            f"model path '{path}' is not on this worker (its agent looked)"]}]
    finally:
        lv.close()
