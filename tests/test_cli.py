"""The dry-run CLI as people and scripts use it: real processes, real files, exit codes."""

import json
import os
import subprocess
import sys

import pytest
import yaml

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "gpuflow", "examples")
CLUSTER = os.path.join(EXAMPLES, "cluster.yaml")


def gpuflow(*args, check=None):
    p = subprocess.run([sys.executable, "-m", "gpuflow.cli", *args], capture_output=True, text=True,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if check is not None:
        assert p.returncode == check, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    return p


def write(tmp_path, name, data) -> str:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data) if name.endswith(".yaml") else json.dumps(data))
    return str(p)


def test_schedule_json_contract(tmp_path, llama3_gguf):
    p = gpuflow("schedule", "--cluster", CLUSTER, "--model", os.path.join(EXAMPLES, "model-llama3-gguf.yaml"),
                "--model-path", llama3_gguf, "--json", check=0)
    out = json.loads(p.stdout)
    assert set(out) >= {"scheduled", "placement", "strategy", "score", "candidates", "filters", "reasons"}
    assert out["scheduled"] is True and out["strategy"] == "single_gpu"
    assert set(out["placement"]) == {"worker", "gpu_indexes", "claim", "subordinates"}
    assert all(set(c["scores"]) == {"placement", "locality"} for c in out["candidates"])
    status = next(f for f in out["filters"] if f["filter"] == "status")
    assert status["removed"] == [{"worker": "hostdown", "reasons": ["worker state is not_ready, not ready"]}]
    assert out["score"] == max(c["score"] for c in out["candidates"])


def test_schedule_table_and_unschedulable_exit_3(tmp_path):
    spec = write(tmp_path, "big.yaml", {"name": "huge", "source": {"local_path": "/m/huge"}, "backend": "custom",
                                         "run_command": "serve", "resources": {"vram": "900 GiB", "ram": "1 GiB"}})
    p = gpuflow("schedule", "--cluster", CLUSTER, "--model", spec, check=3)
    assert "UNSCHEDULABLE" in p.stdout and "900.0 GiB" in p.stdout
    p = gpuflow("schedule", "--cluster", CLUSTER, "--model", spec, "--json", check=3)
    assert json.loads(p.stdout)["placement"] is None


@pytest.mark.parametrize("workers, listed, note", [
    (3, 3 * 8, False),  # 24 candidates (one per GPU): every one, in the policy's order
    (40, 30, True),  # 320: the best 30 by score, and how many there were; --json has them all
])
def test_schedule_table_lists_at_most_30_candidates(tmp_path, workers, listed, note):
    cluster = {"version": 1, "workers": [
        {"name": f"w{k}", "ram_total": "512 GiB", "gpus": [{"index": i, "vram_total": "80 GiB"} for i in range(8)]}
        for k in range(workers)]}
    spec = write(tmp_path, "m.yaml", {"name": "m", "source": {"local_path": "/m/m"}, "backend": "custom",
                                       "run_command": "serve", "resources": {"vram": "30 GiB", "ram": "1 GiB"}})
    p = gpuflow("schedule", "--cluster", write(tmp_path, "c.json", cluster), "--model", spec, check=0)
    table = p.stdout.split("candidates (")[1].split("\n\n")[0].splitlines()[3:]
    assert len(table) == listed and table[0].startswith("*")  # the pick first: the best
    assert (f"the best 30 of {workers * 8:,} by score; --json lists every one" in p.stdout) == note
    p = gpuflow("schedule", "--cluster", write(tmp_path, "c.json", cluster), "--model", spec, "--json", check=0)
    assert len(json.loads(p.stdout)["candidates"]) == workers * 8


@pytest.mark.parametrize("spec, message", [
    ({"name": "x", "source": {"local_path": "/m"}, "backend": "tensorrt"}, "backend: Input should be 'vllm', 'sglang', 'llama.cpp', 'custom' or 'voxbox'"),
    ({"name": "x", "source": {"local_path": "/m"}, "backend": "custom", "run_command": "s", "replicas": -1}, "replicas: Input should be greater than or equal to 0"),
    ({"name": "x", "source": {"local_path": "/m"}, "backend": "vllm", "gpu_selector": {"gpu_ids": ["host1-0"]}}, "gpu_selector.gpu_ids: GPU id 'host1-0' is not 'worker:type:index'"),
    ({"name": "x", "source": {}, "backend": "vllm"}, "source: give exactly one of local_path, huggingface, modelscope"),
    ({"name": "x", "source": {"local_path": "/m"}, "backend": "custom"}, "backend custom needs run_command"),
    ({"name": "x", "source": {"local_path": "/m"}, "backend": "vllm", "replica": 2},
     "replica: Extra inputs are not permitted (did you mean 'replicas'?)"),
    ({"name": "x", "source": {"local_path": "/m"}, "backend": "vllm", "worker_selecter": {"a": "b"}},
     "worker_selecter: Extra inputs are not permitted (did you mean 'worker_selector'?)"),
    ({"name": "x", "source": {"local_path": "/m"}, "backend": "custom", "run_command": "s", "resources": {"vrma": 1}},
     "resources.vrma: Extra inputs are not permitted (did you mean 'vram'?)"),  # a field of the nested block
    ({"name": "x", "source": {"local_path": "/m"}, "backend": "vllm", "zzz": 1}, "zzz: Extra inputs are not permitted\n"),
    ({"name": "x", "source": {"local_path": "/m"}, "backend": "custom", "run_command": "s", "resources": {"vram": "lots"}}, "resources.vram: Value error, 'lots' is not a byte size"),
    ({"name": "x", "source": {"local_path": "/m"}, "backend": "custom", "run_command": "s", "resources": {"vram": "-5 GiB"}},
     "resources.vram: Value error, '-5 GiB' is negative; a byte size is 0 or more"),
    ({"name": "x", "source": {"local_path": "/m"}, "backend": "custom", "run_command": "s", "resources": {"vram": "-5 GBB"}},
     "resources.vram: Value error, '-5 GBB' is not a byte size"),  # negative, and no unit either: not a size at all
    # a value one of a list names: the closest, where one is close
    ({"name": "x", "source": {"local_path": "/m"}, "backend": "vlm"}, "(got 'vlm') (did you mean 'vllm'?)"),
    ({"name": "pd", "source": {"local_path": "/m"}, "backend": "custom", "run_command": "s {port}",
      "roles": [{"name": "prefill"}, {"name": "decode"}], "disaggregation": {"mode": "vllm-nixel"}},
     "disaggregation.mode: Input should be 'vllm-nixl', 'vllm-mooncake', 'sglang-mooncake', 'sglang-nixl', "
     "'vllm-ascend-mooncake' or 'custom' (got 'vllm-nixel') (did you mean 'vllm-nixl'?)"),
    ({"name": "x", "source": {"local_path": "/m"}, "backend": "tensorrt"}, "(got 'tensorrt')\n"),  # none close
])
def test_invalid_spec_exit_2_names_the_field(tmp_path, spec, message):
    p = gpuflow("schedule", "--cluster", CLUSTER, "--model", write(tmp_path, "s.yaml", spec), check=2)
    assert message.replace("Value error, ", "") in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("snapshot, message", [
    ({"workers": [{"name": "a", "ram_total": 1, "gpus": [{"index": 0, "vram_total": 1}, {"index": 0, "vram_total": 1}]}]},
     "workers.0.gpus: Value error, GPU index 0 appears twice"),
    ({"workers": [{"name": "a", "ram_total": 1, "state": "sleepy"}]}, "workers.0.state: Input should be"),
    ({"workers": [{"name": "a"}]}, "workers.0.ram_total: Field required"),
    ({"version": 2}, "version 2 is not supported"),
    ({"workers": [{"name": "a", "ram_total": 1, "lables": {}, "gpus": [{"index": 0, "vram_totl": 1}]}]},
     "workers.0.gpus.0.vram_totl: Extra inputs are not permitted (did you mean 'vram_total'?)"),
    ({"workers": [{"name": "a", "ram_total": 1, "lables": {}}]},
     "workers.0.lables: Extra inputs are not permitted (did you mean 'labels'?)"),
])
def test_invalid_cluster_exit_2(tmp_path, snapshot, message):
    p = gpuflow("schedule", "--cluster", write(tmp_path, "c.json", snapshot), "--model",
                os.path.join(EXAMPLES, "model-custom.yaml"), check=2)
    assert message.replace("Value error, ", "") in p.stderr


def test_bad_model_files_exit_2(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 16)
    spec = write(tmp_path, "s.yaml", {"name": "x", "source": {"local_path": str(bad)}, "backend": "llama.cpp"})
    p = gpuflow("schedule", "--cluster", CLUSTER, "--model", spec, check=2)
    assert "bad.gguf" in p.stderr and "tensor count" in p.stderr
    spec = write(tmp_path, "h.yaml", {"name": "x", "source": {"local_path": str(tmp_path)}, "backend": "vllm"})
    p = gpuflow("schedule", "--cluster", CLUSTER, "--model", spec, check=2)
    assert "no config.json" in p.stderr
    spec = write(tmp_path, "n.yaml", {"name": "x", "source": {"huggingface": {"repo": "o/x"}}, "backend": "vllm"})
    p = gpuflow("schedule", "--cluster", CLUSTER, "--model", spec, check=2)
    assert "has no local files to estimate from" in p.stderr


def test_estimate_json_like_gguf_parser(smollm2):
    p = gpuflow("estimate", smollm2, "--json", "--gpu-layers-step", "10", check=0)
    e = json.loads(p.stdout)["estimate"]
    assert [i["offloadLayers"] for i in e["items"]] == [0, 10, 20, 30, 31]
    last = e["items"][-1]
    assert last["fullOffloaded"] and last["vrams"][0]["nonuma"] == 821_800_192 and last["ram"]["nonuma"] == 212_467_200
    assert set(last["vrams"][0]) >= {"handleLayers", "remote", "position", "uma", "nonuma"}
    assert e["contextSize"] == 8192 and e["noMMap"] is False
    p = gpuflow("estimate", smollm2, "--json", "--ctx-size", "2048", "--tensor-split", "1,1", "--rpc", "h:1",
                "--no-mmap", "--platform-footprint", "150,500", "--cache-type-k", "q8_0", "--flash-attention", check=0)
    e = json.loads(p.stdout)["estimate"]
    assert e["contextSize"] == 2048 and e["noMMap"] and [v["remote"] for v in e["items"][0]["vrams"]] == [True, False]
    p = gpuflow("estimate", smollm2, "--cache-type-k", "q3", check=2)
    assert "cache-type-k: 'q3' is not one of" in p.stderr
    assert gpuflow("estimate", smollm2, check=0).stdout.startswith("llama (30 layers), context 8192")


def test_estimate_hf_dir(qwen7b_dir):
    out = json.loads(gpuflow("estimate", qwen7b_dir, "--json", check=0).stdout)
    assert out["weight_bytes"] == 15_231_233_024 and out["kv_cache_bytes_per_token"] == 57_344


def test_rank_scale_down():
    out = json.loads(gpuflow("rank-scale-down", "--cluster", CLUSTER, "--model", "llama3-8b-q5", "--json", check=0).stdout)
    assert [r["name"] for r in out["order"]] == ["llama3-8b-q5-bbbbb", "llama3-8b-q5-ccccc", "llama3-8b-q5-aaaaa"]
    assert set(out["order"][0]["scores"]) == {"status", "offload", "placement"}
    assert gpuflow("rank-scale-down", "--cluster", CLUSTER, "--model", "nope", check=2).stderr.startswith("gpuflow: error:")


def test_weights_from_environment(tmp_path, llama3_gguf):
    env = {**os.environ, "GPUFLOW_SCHEDULER__LOCALITY": "0"}
    p = subprocess.run([sys.executable, "-m", "gpuflow.cli", "schedule", "--cluster", CLUSTER, "--model",
                        os.path.join(EXAMPLES, "model-llama3-gguf.yaml"), "--model-path", llama3_gguf, "--json"],
                       capture_output=True, text=True, env=env)
    assert all("locality" not in c["scores"] for c in json.loads(p.stdout)["candidates"])


def test_dry_run_runs(tmp_path):
    p = gpuflow("dry-run", "--data-dir", str(tmp_path / "demo"), check=0)
    assert p.stdout.count("SCHEDULED on") == 3 and "removal order" in p.stdout


def test_help_names_the_way_in_and_the_exit_codes():
    out = gpuflow("--help", check=0).stdout
    assert "main job" not in out
    assert "dry-run             dry-run placements of the bundled examples, offline" in out  # 'demo': the live stack's
    assert "demo                the old name of 'gpuflow dry-run' (an alias)" in out
    assert "start here: 'gpuflow dev'" in out
    assert "exit codes: 0 done; 1 Temporal reported an error; 2 invalid input; 3 unschedulable" in out


def test_no_temporal_says_how_to_start_one_exit_4():
    """Not invalid input (2): nothing the user typed was wrong; the service is not there."""
    from gpuflow.ports import server_port

    p = gpuflow("status", "--address", f"127.0.0.1:{server_port()}", check=4)
    assert "cannot reach Temporal at 127.0.0.1:" in p.stderr and "Start one on this machine with 'gpuflow dev'" in p.stderr
    assert "Traceback" not in p.stderr


def test_stdout_closed_early_is_quiet():
    """`gpuflow schedule --json | head -0`: the reader is gone before anything is written."""
    p = subprocess.Popen([sys.executable, "-m", "gpuflow.cli", "schedule", "--cluster", CLUSTER, "--model",
                          os.path.join(EXAMPLES, "model-custom.yaml"), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=60) == 141  # as a process ended by SIGPIPE
    assert err == ""
