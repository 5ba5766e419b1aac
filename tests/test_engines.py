"""Engine command lines from the placement (argv, never a shell string)."""

from __future__ import annotations

import pytest

from scheduler.errors import InvalidInput
from worker_agent.engines import EngineConfig, EngineUnavailable, argv_for, llama_cpp_argv, sglang_argv, vllm_argv
from worker_agent.payloads import LaunchRequest

CFG = EngineConfig()


def req(backend="vllm", gpus=(0,), params=(), **kw) -> LaunchRequest:
    kw.setdefault("model_path", "/models/m")
    return LaunchRequest(instance="m-0", model="m", backend=backend, gpu_indexes=list(gpus),
                         backend_parameters=list(params), **kw)


HEAD_V = ["vllm", "serve", "/models/m", "--served-model-name", "m", "--host", "127.0.0.1", "--port", "8000"]


@pytest.mark.parametrize("r,tail", [
    (req(), []),                                                        # one GPU: no TP flag
    (req(gpus=(0, 1, 2, 3)), ["--tensor-parallel-size", "4"]),          # TP = GPUs placed
    (req(gpus=(2, 3), vram_utilization=0.8), ["--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.8000"]),
    (req(gpus=(0, 1), params=["--tensor-parallel-size=2", "--max-model-len", "8192"]),
     ["--tensor-parallel-size=2", "--max-model-len", "8192"]),           # the user's flag wins, not doubled
    (req(gpus=(0, 1), params=["-pp", "2"]), ["-pp", "2"]),              # pipeline parallel: TP left to the user
    (req(params=["; rm -rf /"]), ["; rm -rf /"]),                       # one argv word: no shell sees it
])
def test_vllm(r, tail):
    assert vllm_argv(r, 8000, CFG) == HEAD_V + tail


def test_sglang():
    r = req("sglang", gpus=(0, 1), vram_utilization=0.85)
    assert sglang_argv(r, 9000, CFG) == ["python3", "-m", "sglang.launch_server", "--model-path", "/models/m",
                                         "--served-model-name", "m", "--host", "127.0.0.1", "--port", "9000",
                                         "--tp", "2", "--mem-fraction-static", "0.8500"]


@pytest.mark.parametrize("r,tail", [
    (req("llama.cpp", offload_layers=33), ["-ngl", "33"]),                    # full offload on one GPU
    (req("llama.cpp", gpus=(0, 1), offload_layers=33, tensor_split=[9, 7]),   # bytes per GPU, as the claim split them
     ["-ngl", "33", "--tensor-split", "9,7"]),
    (req("llama.cpp", gpus=(), offload_layers=0), ["-ngl", "0"]),             # CPU only
    (req("llama.cpp", offload_layers=20, params=["-c", "4096", "--n-gpu-layers", "10"]),
     ["-c", "4096", "--n-gpu-layers", "10"]),                                 # the user's layer count wins
])
def test_llama_cpp(r, tail):
    assert llama_cpp_argv(r, 8080, CFG) == ["llama-server", "-m", "/models/m", "--host", "127.0.0.1",
                                            "--port", "8080"] + tail


@pytest.mark.parametrize("r,cfg,problem", [
    (req("vllm"), EngineConfig(vllm="/nonexistent/vllm"), "vllm is not installed on this host"),
    (req("llama.cpp"), CFG, "llama.cpp is not installed on this host: 'llama-server'"),
    (req("custom", run_command="srv {port}"), CFG, "not enabled on this host"),
    (req("tensorrt"), CFG, "no launcher"),
    (req("vllm", distributed=True), CFG, "several workers are not launched yet"),
    (req("vllm", model_path=None), CFG, "needs the model's local path"),
])
def test_unavailable_is_named(r, cfg, problem):
    with pytest.raises(InvalidInput, match=problem) as e:
        argv_for(r, 8000, cfg)
    assert isinstance(e.value, EngineUnavailable) == ("local path" not in problem)


def test_custom_when_enabled():
    r = req("custom", run_command="srv --port {port} --gpus {gpu_indexes}", gpus=(1, 3))
    assert argv_for(r, 7000, EngineConfig(allow_custom=True)) == ["srv", "--port", "7000", "--gpus", "1,3"]


@pytest.mark.parametrize("path,ok", [
    ("/srv/models/llama/x.gguf", True),
    ("/srv/models", True),
    ("/srv/models/../secrets/key", False),   # '..' resolved first
    ("/srv/models-evil/x", False),           # a prefix is not a parent
    ("/etc/passwd", False),
])
def test_model_roots(path, ok):
    r = req("vllm", model_path=path)
    cfg = EngineConfig(vllm="/bin/true", model_roots=("/srv/models",))
    if ok:
        assert argv_for(r, 8000, cfg)[2] == path
    else:
        with pytest.raises(InvalidInput, match="outside this host's model roots"):
            argv_for(r, 8000, cfg)


def test_model_root_symlink_escape(tmp_path):
    root = tmp_path / "models"
    root.mkdir()
    (root / "escape").symlink_to("/etc")
    with pytest.raises(InvalidInput, match="outside"):
        argv_for(req("vllm", model_path=str(root / "escape" / "passwd")), 8000,
                 EngineConfig(vllm="/bin/true", model_roots=(str(root),)))
