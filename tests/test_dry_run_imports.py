"""`gpuflow schedule` for a spec that states its resources, with no GPUFLOW_ variable set, imports
only what it uses: not transformers (no config to read; nor for a vLLM model whose local
config.json answers alone, scheduler/hf/config.py), not pydantic-settings (the defaults need
no environment parsing, gpuflow/policy_env.py), not the Temporal SDK (no cluster to ask). Each of
them costs a large part of the command's time on a big cluster file (bench/bench_schedule_cli.py
prints the figures); this checks which modules load, not how long they take."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.test_cli import CLUSTER, EXAMPLES

PROBE = """import runpy, sys
sys.argv = ["gpuflow"] + sys.argv[1:]
try:
    runpy.run_module("gpuflow", run_name="__main__")
except SystemExit as e:
    code = e.code
print("CODE", code, " ".join(sorted(m for m in ("transformers", "pydantic_settings", "temporalio") if m in sys.modules)))
"""


def run(*args: str, **extra_env: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("GPUFLOW_")}
    p = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env={**env, **extra_env})
    assert p.returncode == 0 and "CODE" in p.stdout, p.stderr
    return p.stdout.strip().splitlines()[-1].split()[1:]


@pytest.mark.parametrize("extra_env, loaded", [
    ({}, []),
    # a GPUFLOW_ variable: the full Settings reads and checks the environment
    ({"GPUFLOW_SCHEDULER__LOCALITY": "0"}, ["pydantic_settings"]),
])
def test_schedule_imports_only_what_it_uses(extra_env, loaded):
    code, *modules = run("schedule", "--cluster", CLUSTER, "--model", os.path.join(EXAMPLES, "model-custom.yaml"),
                         **extra_env)
    assert code == "0" and modules == loaded


@pytest.mark.parametrize("model_type, loaded", [
    ("qwen2", []),  # every key stated: the standard library reads the file
    ("deepseek_v3", ["transformers"]),  # a type whose defaults only transformers knows: AutoConfig
])
def test_schedule_reads_a_local_config_without_transformers_where_the_file_answers(tmp_path, model_type, loaded):
    from gpuflow.demo.synthetic import llama_like_hf

    model = llama_like_hf(str(tmp_path / "m"), layers=28, hidden=3584, ff=18944, heads=28, kv_heads=4, vocab=152064,
                          max_pos=32768, arch="Qwen2ForCausalLM", model_type=model_type)
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: m\nsource: {{local_path: {model}}}\nbackend: vllm\n")
    code, *modules = run("schedule", "--cluster", CLUSTER, "--model", str(spec), HF_HUB_OFFLINE="1")
    assert code == "0" and modules == loaded
