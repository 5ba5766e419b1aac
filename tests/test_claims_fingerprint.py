"""Fingerprints (scheduler/claims/fingerprint.py): which parameters change a replica's memory, and
so its fingerprint, and which leave it as it is. Table: two replicas, equal or not, and why."""

from __future__ import annotations

import pytest

from scheduler.claims.fingerprint import fingerprint, memory_params, of_spec, text_key
from scheduler.spec import ModelSpec

HF = "huggingface:Qwen/Qwen2.5-7B-Instruct"
BASE = dict(source=HF, backend="vllm", parameters=["--max-model-len", "8192"], gpu_model="NVIDIA H100 80GB HBM3")


def fp(**over):
    d = {**BASE, **over}
    return fingerprint(d.pop("source"), d.pop("backend"), d.pop("parameters"), d.pop("gpu_model"), **d)


# name, the other replica, same fingerprint?
EQUALITY = [
    # spellings of one parameter
    ("--k=v", dict(parameters=["--max-model-len=8192"]), True),
    ("underscores (vLLM's argparse)", dict(parameters=["--max_model_len", "8192"]), True),
    ("one string as the usage report joins it", dict(parameters="--max-model-len 8192"), True),
    # parameters that do not change memory
    ("a port, a log level", dict(parameters=["--max-model-len", "8192", "--port", "9000", "--uvicorn-log-level",
                                             "debug"]), True),
    ("a chat template, tool parser", dict(parameters=["--max-model-len", "8192", "--enable-auto-tool-choice",
                                                      "--tool-call-parser", "hermes"]), True),
    ("a default written out (tp 1)", dict(parameters=["--max-model-len", "8192", "-tp", "1"]), True),
    ("a flag's second occurrence (the first wins)", dict(parameters=["--max-model-len", "8192",
                                                                     "--max-model-len", "4096"]), True),
    # each parameter that changes memory
    ("context length", dict(parameters=["--max-model-len", "32768"]), False),
    ("no context length given", dict(parameters=[]), False),
    ("tensor parallel", dict(parameters=["--max-model-len", "8192", "--tensor-parallel-size", "2"]), False),
    ("pipeline parallel", dict(parameters=["--max-model-len", "8192", "-pp", "2"]), False),
    ("quantization", dict(parameters=["--max-model-len", "8192", "--quantization", "fp8"]), False),
    ("KV dtype", dict(parameters=["--max-model-len", "8192", "--kv-cache-dtype", "fp8"]), False),
    ("max sequences", dict(parameters=["--max-model-len", "8192", "--max-num-seqs", "64"]), False),
    ("the spec's memory share", dict(parameters=["--max-model-len", "8192", "--gpu-memory-utilization", "0.5"]), False),
    ("eager (no CUDA graphs)", dict(parameters=["--max-model-len", "8192", "--enforce-eager"]), False),
    # and the rest of what a fingerprint is
    ("GPU model", dict(gpu_model="NVIDIA A100-SXM4-80GB"), False),
    ("backend version", dict(backend_version="0.11.0"), False),
    ("digest", dict(digest="a3f9c2"), False),
    ("model source", dict(source="huggingface:Qwen/Qwen2.5-14B-Instruct"), False),
    ("backend (sglang's --max-model-len is not its context flag)", dict(backend="sglang"), False),
]


@pytest.mark.parametrize("name, other, same", EQUALITY, ids=[x[0] for x in EQUALITY])
def test_equality(name, other, same):
    assert (fp().key == fp(**other).key) is same


# engine, parameters, the memory parameters read
PARAMS = [
    ("vllm", "-tp 2 --max-model-len 8192 --port 1", (("context", "8192"), ("tp", "2"))),
    ("sglang", "--context-length 4096 --tp-size 2 --mem-fraction-static 0.8 --host 0.0.0.0",
     (("context", "4096"), ("memory_fraction", "0.8"), ("tp", "2"))),
    # llama.cpp: short flags, a negative value (-ngl -1), and -fa without a value (a switch, its old form)
    ("llama.cpp", "-c 8192 -ngl -1 -fa --host 0.0.0.0 -np 4 -ctk q8_0",
     (("context", "8192"), ("flash_attn", "on"), ("gpu_layers", "-1"), ("kv_dtype_k", "q8_0"), ("max_seqs", "4"))),
    ("llama.cpp", "--ctx-size=8192 --flash-attn on", (("context", "8192"), ("flash_attn", "on"))),
    # a custom command: every word counts, in order (nothing says which do not)
    ("custom", "--x 1 --y", (("0", "--x"), ("1", "1"), ("2", "--y"))),
]


@pytest.mark.parametrize("backend, params, expected", PARAMS)
def test_memory_params(backend, params, expected):
    assert memory_params(backend, params) == expected


def test_of_spec_is_the_ingests_fingerprint():
    # a placement fingerprints the spec; the store the usage report (source key, backend, the joined
    # parameters, the GPU model, the spec's backend_version): one key
    spec = ModelSpec(name="q", source={"huggingface": {"repo": "Qwen/Qwen2.5-7B-Instruct"}}, backend="vllm",
                     backend_version="0.11.0", backend_parameters=["--max-model-len=8192", "--seed", "9"])
    report = fingerprint(spec.source.key, "vllm", "--max-model-len=8192 --seed 9", "NVIDIA L4", backend_version="0.11.0")
    assert of_spec(spec, "NVIDIA L4").key == report.key
    assert report.label() == "huggingface:Qwen/Qwen2.5-7B-Instruct vllm 0.11.0 [context=8192] on NVIDIA L4"


def test_the_usage_profiles_hash_the_same_way():
    from contracts.usage import ReplicaUse
    from store.usage import profile_key

    r = ReplicaUse(instance="q-0", source=HF, backend="vllm", parameters="-tp 2", gpu_model="L4")
    assert profile_key(r) == text_key(HF, "vllm", "-tp 2", "L4")
