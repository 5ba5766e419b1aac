"""Hub sources, downloaded by the real agent with huggingface_hub from a Hugging Face mirror on
localhost (tests/hub_mirror.py: the hub itself cannot be reached from here). The files land in
the agent's model cache; `gpuflow status` shows the progress the download heartbeats; an agent
killed mid-download resumes it (a Range request from where the partial file ends); a broken
download is ERROR with its reason and restarts; a repository that is not there is ERROR at once;
the store records which host holds the files."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from sqlmodel import Session, select

from store.tables import ModelFileRow
from gpuflow import ops
from views.render import cluster as render_cluster
from scheduler.spec import ModelSpec
from tests.hub_mirror import COMMIT, HubMirror
from tests.live import FAST, Live
from tests.test_distributed_launch import calls, stand_ins

MiB = 2**20
WEIGHTS = os.urandom(40 * MiB)
REPO = {"config.json": json.dumps({"architectures": ["LlamaForCausalLM"]}).encode(), "model.safetensors": WEIGHTS}
HUB_ENV = {"HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_XET": "1"}


@pytest.fixture
def mirror():
    m = HubMirror({"org/tiny": REPO})
    yield m
    m.close()


def spec(repo: str = "org/tiny") -> ModelSpec:
    return ModelSpec.model_validate({"name": "tiny", "source": {"huggingface": {"repo": repo}}, "backend": "vllm",
                                     "resources": {"vram": "8 GiB"}})


def file_states(lv: Live) -> dict[tuple[str, str], str]:
    with Session(lv.engine) as s:
        return {(f.worker, f.source): f.state for f in s.exec(select(ModelFileRow))}


async def test_download_shows_progress_and_resumes_after_the_agent_dies(tmp_path, mirror):
    mirror.rate = 8 * MiB  # about 5 s for the weights: time to watch, and to kill the agent midway
    (vllm,) = stand_ins(tmp_path, "vllm")
    args = ["--vllm", vllm, "--hf-endpoint", mirror.url]
    lv = await Live(str(tmp_path), env=HUB_ENV).start({"g1": [24]}, agent_args=args)
    try:
        await ops.deploy(lv.client, spec(), FAST)
        seen = {}

        async def progressed() -> bool:
            st = await ops.status(lv.client, "tiny")
            insts = st["deployments"][0]["instances"]
            i = insts[0] if insts else {"state": "none yet"}
            if i["state"] == "downloading" and (i.get("download") or {}).get("done", 0) >= 8 * MiB:
                seen.update(i, text=render_cluster.status(st))
                return True
            return False

        for _ in range(300):
            if await progressed():
                break
            await asyncio.sleep(0.1)
        d = seen["download"]
        assert d["what"] == "huggingface:org/tiny" and d["total"] == len(WEIGHTS) + len(REPO["config.json"])
        assert "0.04 GiB (" in seen["text"] and "DOWNLOADING" in seen["text"]
        assert file_states(lv) == {("g1", "huggingface:org/tiny"): "downloading"}

        lv.stack.kill_host("g1", processes=False)  # the agent dies mid-download
        lv.add_host("g1", [24], args)
        await lv.wait(lambda: lv.states() == {"tiny-0": "running"}, 90, "RUNNING after the resumed download")
        starts = mirror.ranges("model.safetensors")
        assert starts[0] == 0 and max(starts) >= 8 * MiB  # the second agent asked only for the rest

        v = next(c for c in calls(tmp_path) if c["prog"] == "vllm")
        path = v["argv"][1]
        assert path == os.path.join(lv.stack.data_dir, "models", "huggingface", "org", "tiny", COMMIT)
        with open(os.path.join(path, "model.safetensors"), "rb") as f:
            assert f.read() == WEIGHTS  # whole and intact
        assert file_states(lv) == {("g1", "huggingface:org/tiny"): "ready"}
    finally:
        lv.close()


async def test_broken_download_is_an_error_then_recovers(tmp_path, mirror):
    t = FAST.model_copy(update={"download_attempts": 1})
    mirror.cut_after = 0  # every connection breaks before the first byte of the file
    (vllm,) = stand_ins(tmp_path, "vllm")
    lv = await Live(str(tmp_path), t=t, env=HUB_ENV).start(
        {"g1": [24, 24]}, agent_args=["--vllm", vllm, "--hf-endpoint", mirror.url])
    try:
        await ops.deploy(lv.client, spec(), t)
        await lv.wait(lambda: any("download of huggingface:org/tiny failed" in i.reason for i in lv.instances()), 60,
                      "ERROR naming the broken download", every=0.1)
        assert file_states(lv) == {("g1", "huggingface:org/tiny"): "error"}
        mirror.cut_after = None  # the network heals: the restart downloads it
        await lv.wait(lambda: lv.states() == {"tiny-0": "running"}, 60, "RUNNING after the restart")
        assert lv.instances()[0].restarts >= 1
        assert file_states(lv) == {("g1", "huggingface:org/tiny"): "ready"}

        await ops.deploy(lv.client, spec("org/missing").model_copy(update={"name": "gone"}), t)
        await lv.wait(lambda: any("huggingface:org/missing is not on the hub" in i.reason
                                  for i in lv.instances("gone")), 30, "ERROR: no such repository", every=0.1)
        assert not any(c["argv"][1].endswith("missing") for c in calls(tmp_path))
    finally:
        lv.close()


async def test_a_hub_gguf_is_estimated_from_its_header_downloaded_and_served(tmp_path, smollm2):
    """The whole path for a hub model, with a real engine: the control plane estimates SmolLM2
    from its GGUF header alone (fetched from the mirror), the agent downloads the 98 MB file,
    llama-cpp-python serves it, and a completion comes back."""
    import sys
    import urllib.request

    m = HubMirror({"HuggingFaceTB/SmolLM2-135M-Instruct-GGUF": {"smollm2-135m-instruct-q4_1.gguf": smollm2}})
    lv = await Live(str(tmp_path), env={**HUB_ENV, "GPUFLOW_HF_ENDPOINT": m.url}).start(
        {"cpu1": [24]}, agent_args=["--llama-cpp-python", sys.executable])
    try:
        spec = ModelSpec.model_validate({
            "name": "smol", "backend": "llama.cpp", "backend_parameters": ["-c", "512"],
            "source": {"huggingface": {"repo": "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF",
                                       "file": "smollm2-135m-instruct-q4_1.gguf"}},
            "timings": {"ready_timeout_s": 120}})  # the spec's own: a model loads for long on a loaded machine
        await ops.deploy(lv.client, spec)
        await lv.wait(lambda: lv.states("smol") == {"smol-0": "running"}, 150, "smol RUNNING")
        row = lv.instances("smol")[0]
        assert row.decision["placement"]["claim"]["offload_layers"] == 31  # the same estimate as the local file's
        body = json.dumps({"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}).encode()
        rq = urllib.request.Request(f"http://127.0.0.1:{row.port}/v1/completions", data=body,  # its engine key:
                                    headers={"Content-Type": "application/json",  # store/engine_keys.py
                                             "Authorization": f"Bearer {row.engine_key}"})
        with urllib.request.urlopen(rq, timeout=120) as r:
            out = json.loads(r.read())
        assert out["usage"]["completion_tokens"] > 0 and out["choices"][0]["text"].strip(), out
        rec = lv.stack.instance_processes("cpu1").find("smol-0")
        model = rec.argv[rec.argv.index("--model") + 1]
        assert model.startswith(os.path.join(lv.stack.data_dir, "models", "huggingface")) and model.endswith(".gguf")
        assert os.path.getsize(model) == os.path.getsize(smollm2)
        assert file_states(lv) == {("cpu1", "huggingface:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:"
                                            "smollm2-135m-instruct-q4_1.gguf"): "ready"}
    finally:
        lv.close()
        m.close()


async def test_an_unreachable_hub_is_retried_until_it_answers(tmp_path, smollm2):
    """Estimation needs the hub: while it does not answer, the instance is ERROR saying so and
    tries again with backoff; once the mirror is up, the model is placed and started."""
    from gpuflow.ports import server_port

    port = server_port()
    (llama,) = stand_ins(tmp_path, "llama-server")
    lv = await Live(str(tmp_path), env={**HUB_ENV, "GPUFLOW_HF_ENDPOINT": f"http://127.0.0.1:{port}"}).start(
        {"g1": [24]}, agent_args=["--llama-server", llama])
    m = None
    try:
        spec = ModelSpec.model_validate({"name": "smol", "backend": "llama.cpp",
                                         "source": {"huggingface": {"repo": "org/smol", "file": "smol.gguf"}}})
        await ops.deploy(lv.client, spec, FAST)
        await lv.wait(lambda: any("cannot reach the hub" in i.reason and "trying again in" in i.reason
                                  for i in lv.instances()), 60, "ERROR: the hub does not answer", every=0.1)
        m = HubMirror({"org/smol": {"smol.gguf": smollm2}}, port=port)
        await lv.wait(lambda: lv.states() == {"smol-0": "running"}, 60, "RUNNING once the hub answers")
    finally:
        lv.close()
        if m:
            m.close()
