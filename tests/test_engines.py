"""Engine command lines from the placement (argv, never a shell string)."""

from __future__ import annotations

import pytest

from scheduler.errors import InvalidInput
from worker_agent.engines import EngineConfig, EngineUnavailable, argv_for, llama_cpp_argv, sglang_argv, vllm_argv
from contracts.agent import LaunchRequest

CFG = EngineConfig()


def req(backend="vllm", gpus=(0,), params=(), **kw) -> LaunchRequest:
    kw.setdefault("model_path", "/models/m")
    return LaunchRequest(instance="m-0", model="m", backend=backend, gpu_indexes=list(gpus),
                         backend_parameters=list(params), **kw)


ALIAS = ["--alias", "m"]  # llama-server serves the deployment's name, as vLLM's --served-model-name does
HEAD_V = ["vllm", "serve", "/models/m", "--served-model-name", "m", "--host", "127.0.0.1", "--port", "8000"]
# answers report their cached prompt tokens, which correct the gateway's prefix index (docs/routing.md)
REPORT_V, REPORT_S = ["--enable-prompt-tokens-details"], ["--enable-cache-report"]


@pytest.mark.parametrize("r,tail", [
    (req(), REPORT_V),                                                  # one GPU: no TP flag
    (req(gpus=(0, 1, 2, 3)), ["--tensor-parallel-size", "4", *REPORT_V]),  # TP = GPUs placed
    (req(gpus=(2, 3), vram_utilization=0.8),
     ["--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.8000", *REPORT_V]),
    (req(gpus=(0, 1), params=["--tensor-parallel-size=2", "--max-model-len", "8192"]),
     [*REPORT_V, "--tensor-parallel-size=2", "--max-model-len", "8192"]),  # the user's flag wins, not doubled
    (req(gpus=(0, 1), params=["-pp", "2"]), [*REPORT_V, "-pp", "2"]),   # pipeline parallel: TP left to the user
    (req(params=["; rm -rf /"]), [*REPORT_V, "; rm -rf /"]),            # one argv word: no shell sees it
    (req(params=["--enable-prompt-tokens-details"]), REPORT_V),         # the user's own: not doubled
])
def test_vllm(r, tail):
    assert vllm_argv(r, 8000, CFG) == HEAD_V + tail


def test_sglang():
    r = req("sglang", gpus=(0, 1), vram_utilization=0.85)
    assert sglang_argv(r, 9000, CFG) == ["python3", "-m", "sglang.launch_server", "--model-path", "/models/m",
                                         "--served-model-name", "m", "--host", "127.0.0.1", "--port", "9000",
                                         "--tp", "2", "--mem-fraction-static", "0.8500", *REPORT_S]


@pytest.mark.parametrize("r,tail", [
    (req("llama.cpp", offload_layers=33), ["-ngl", "33", *ALIAS]),           # full offload on one GPU
    (req("llama.cpp", gpus=(0, 1), offload_layers=33, tensor_split=[9, 7]),   # bytes per GPU, as the claim split them
     ["-ngl", "33", "--tensor-split", "9,7", *ALIAS]),
    (req("llama.cpp", gpus=(), offload_layers=0), ["-ngl", "0", *ALIAS]),     # CPU only
    (req("llama.cpp", offload_layers=20, params=["-c", "4096", "--n-gpu-layers", "10"]),
     [*ALIAS, "-c", "4096", "--n-gpu-layers", "10"]),                         # the user's layer count wins
])
def test_llama_cpp(r, tail):
    assert llama_cpp_argv(r, 8080, CFG) == ["llama-server", "-m", "/models/m", "--host", "127.0.0.1",
                                            "--port", "8080"] + tail


@pytest.mark.parametrize("r,cfg,problem", [
    (req("vllm"), EngineConfig(vllm="/nonexistent/vllm"), "vllm is not installed on this host"),
    (req("llama.cpp"), CFG, "llama.cpp is not installed on this host: 'llama-server'"),
    (req("custom", run_command="srv {port}"), CFG, "not enabled on this host"),
    (req("tensorrt"), CFG, "no launcher"),
    (req("custom", distributed=True), EngineConfig(allow_custom=True), "custom is not launched across several workers"),
    (req("vllm", distributed=True), CFG, "no helper endpoints came with the launch"),
    (req("llama.cpp", role="rpc-server", part="rpc0"), EngineConfig(rpc_server="/nonexistent/rpc-server"),
     "llama.cpp's rpc-server is not installed on this host"),
    (req("vllm", role="ray-head", part="ray-head"), EngineConfig(ray="/nonexistent/ray"), "ray is not installed"),
    (req("vllm", model_path=None), CFG, "needs the model's local path"),
])
def test_unavailable_is_named(r, cfg, problem):
    with pytest.raises(InvalidInput, match=problem) as e:
        argv_for(r, 8000, cfg)
    assert isinstance(e.value, EngineUnavailable) == ("local path" not in problem)


@pytest.mark.parametrize("r,tail", [
    # two workers x 2 GPUs: TP = the main worker's GPUs, PP = one stage per worker, Ray executes
    (req(gpus=(0, 1), distributed=True, ray_address="10.0.0.1:6379", pipeline_parallel=2),
     ["--tensor-parallel-size", "2", "--pipeline-parallel-size", "2", "--distributed-executor-backend", "ray",
      *REPORT_V]),
    # one GPU per worker on three workers: TP 1 said out loud, PP 3
    (req(gpus=(3,), distributed=True, ray_address="10.0.0.1:6379", pipeline_parallel=3),
     ["--tensor-parallel-size", "1", "--pipeline-parallel-size", "3", "--distributed-executor-backend", "ray",
      *REPORT_V]),
    # the user's own PP wins; ours is not doubled
    (req(gpus=(0, 1), distributed=True, ray_address="h:1", pipeline_parallel=2, params=["-pp", "4"]),
     ["--tensor-parallel-size", "2", "--distributed-executor-backend", "ray", *REPORT_V, "-pp", "4"]),
])
def test_vllm_over_ray(r, tail):
    assert vllm_argv(r, 8000, CFG) == HEAD_V + tail


def test_sglang_nodes():
    # two workers x 2 GPUs: TP spans all 4; rank 0 serves HTTP, rank 1 meets it at --dist-init-addr
    head = req("sglang", gpus=(0, 1), vram_utilization=0.85, distributed=True, nnodes=2, node_rank=0, tp_total=4,
               dist_init_addr="10.0.0.1:5000")
    nodes = ["--dist-init-addr", "10.0.0.1:5000", "--nnodes", "2"]
    assert sglang_argv(head, 9000, CFG)[11:] == ["--tp", "4", "--mem-fraction-static", "0.8500", *REPORT_S, *nodes,
                                                  "--node-rank", "0"]
    other = head.model_copy(update={"role": "sglang-node", "part": "node1", "node_rank": 1})
    argv = argv_for(other, None, EngineConfig(sglang_python="/bin/true"), "10.0.0.2")
    assert argv == ["/bin/true", "-m", "sglang.launch_server", "--model-path", "/models/m", "--served-model-name", "m",
                    "--tp", "4", "--mem-fraction-static", "0.8500", *nodes, "--node-rank", "1"]  # no port: rank 0 serves


def test_llama_cpp_over_rpc():
    # RPC devices come first in llama.cpp's device list, so the split is [rpc0, rpc1, main GPU 0]
    r = req("llama.cpp", gpus=(0,), offload_layers=31, tensor_split=[5, 3, 8], distributed=True,
            rpc_servers=["10.0.0.2:50052", "10.0.0.3:50053"])
    assert llama_cpp_argv(r, 8080, CFG)[7:] == ["-ngl", "31", "--tensor-split", "5,3,8",
                                                "--rpc", "10.0.0.2:50052,10.0.0.3:50053", *ALIAS]


@pytest.mark.parametrize("role,extra,argv", [
    ("rpc-server", {}, ["/bin/true", "-H", "10.0.0.2", "-p", "50052"]),
    ("ray-head", {}, ["/bin/true", "start", "--head", "--block", "--disable-usage-stats", "--node-ip-address",
                      "10.0.0.2", "--port", "50052", "--num-gpus", "2"]),
    ("ray-worker", {"ray_address": "10.0.0.1:6379"},
     ["/bin/true", "start", "--block", "--disable-usage-stats", "--address", "10.0.0.1:6379", "--node-ip-address",
      "10.0.0.2", "--num-gpus", "2"]),
])
def test_helpers_bind_the_advertised_address(role, extra, argv):
    r = req("vllm", gpus=(0, 1), role=role, part="x", **extra)
    assert argv_for(r, 50052, EngineConfig(rpc_server="/bin/true", ray="/bin/true"), "10.0.0.2") == argv


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
