"""Engine flags in each engine's own spelling (issue 26, point 4): the flags gpuflow reads pass in
every spelling llama-server documents, in '--flag value' and '--flag=value' forms, and the
scheduler reads each the same; llama.cpp specs are translated for llama-cpp-python's server (its
real argument parser checks the words), and a flag it has no equivalent for is refused at
validation. Abbreviations and SGLang's '_' forms are refused at validation, naming the flag."""

from __future__ import annotations

import argparse

import pytest

from scheduler import params as P
from scheduler.engine_flags import ENGINES, llama_cpp, spec_flag_problems
from scheduler.engine_flags.llama_cpp_python import GGML_TYPES, RULES, translate
from scheduler.gguf.estimate import LlamaCppOptions
from contracts.agent import LaunchRequest
from worker_agent.engines import EngineConfig, LaunchRefused, argv_for

BASE = LlamaCppOptions()


@pytest.mark.parametrize("words, ctx, parallel, fa, ngl, split", [
    # every spelling llama-server documents, both forms, read the same by the scheduler
    (["-c", "1024"], 1024, BASE.parallel_size, False, None, None),
    (["--ctx-size", "1024"], 1024, BASE.parallel_size, False, None, None),
    (["--ctx-size=1024"], 1024, BASE.parallel_size, False, None, None),
    (["-c=1024", "-np=1"], 1024, 1, False, None, None),
    (["-np", "1", "--parallel=1"], BASE.ctx_size, 1, False, None, None),  # the first occurrence wins
    (["-fa", "on"], BASE.ctx_size, BASE.parallel_size, True, None, None),
    (["--flash-attn=off"], BASE.ctx_size, BASE.parallel_size, False, None, None),
    (["--flash-attn", "enabled"], BASE.ctx_size, BASE.parallel_size, True, None, None),
    (["-ngl", "12"], BASE.ctx_size, BASE.parallel_size, False, 12, None),
    (["--gpu-layers=-1"], BASE.ctx_size, BASE.parallel_size, False, -1, None),  # -1: every layer
    (["--n-gpu-layers", "7"], BASE.ctx_size, BASE.parallel_size, False, 7, None),
    (["-ts", "3,1"], BASE.ctx_size, BASE.parallel_size, False, None, [3.0, 1.0]),
    (["--tensor-split=3/1"], BASE.ctx_size, BASE.parallel_size, False, None, [3.0, 1.0]),  # llama-server's '/'
])
def test_the_scheduler_reads_every_documented_spelling(words, ctx, parallel, fa, ngl, split):
    assert spec_flag_problems("llama.cpp", words, extra=()) == []
    o, gpu_layers = P.llama_cpp_options(words, BASE)
    assert (o.ctx_size, o.parallel_size, o.flash_attention, gpu_layers, P.user_tensor_split(words)) == \
        (ctx, parallel, fa, ngl, split)


@pytest.mark.parametrize("backend, words, named", [
    # '_' forms of flags gpuflow reads: the engine reads them, gpuflow would not, so write the documented one
    ("llama.cpp", ["--ctx_size", "4096"], "write --ctx-size"),
    ("llama.cpp", ["--n_gpu_layers", "4"], "sets --n_gpu_layers"),  # llama-cpp-python's own spelling: gpuflow's
    ("vllm", ["--tensor_parallel_size", "2"], "write --tensor-parallel-size"),
    # argparse prefixes: refused, naming the flag (gpuflow reads and checks full spellings only)
    ("vllm", ["--max-model", "8k"], "'--max-model' abbreviates --max-model-len; write --max-model-len in full"),
    ("vllm", ["--max-model=8k"], "abbreviates --max-model-len"),
    ("vllm", ["--tensor-parallel", "2"], "abbreviates --tensor-parallel-size"),
    ("sglang", ["--context-len", "4096"], "abbreviates --context-length"),
    ("sglang", ["--mem-fraction", "0.8"], "abbreviates --mem-fraction-static"),
    # SGLang's argparse takes no '_' for '-': it would fail at start, so it fails here
    ("sglang", ["--tp_size", "2"], "sglang reads only --tp-size"),
    ("sglang", ["--context_length", "4096"], "write --context-length"),
    # llama.cpp flags llama-cpp-python's server has no equivalent for
    ("llama.cpp", ["-np", "4"], "'-np 4' has no llama-cpp-python equivalent: its server runs one sequence at a time"),
    ("llama.cpp", ["--parallel=2"], "'--parallel=2' has no llama-cpp-python equivalent"),
    ("llama.cpp", ["-fa", "auto"], "never auto: write -fa on or -fa off"),
    ("llama.cpp", ["--swa-full"], "'--swa-full' has no llama-cpp-python equivalent: its server has no such setting"),
    ("llama.cpp", ["--jinja"], "'--jinja' has no llama-cpp-python equivalent"),
    ("llama.cpp", ["-ctk", "bf16"], "names no ggml type"),
])
def test_refused_at_validation_naming_the_flag(backend, words, named):
    got = spec_flag_problems(backend, words, extra=())
    assert len(got) == 1 and named in got[0], got


def test_an_operator_lifts_the_llama_cpp_python_check_flag_by_flag():
    # hosts that all run llama-server: the operator allows --jinja; -np 4 is still refused
    assert spec_flag_problems("llama.cpp", ["--jinja"], extra=("--jinja",)) == []
    assert len(spec_flag_problems("llama.cpp", ["--jinja", "-np", "4"], extra=("--jinja",))) == 1


@pytest.mark.parametrize("words, want", [
    (["-c", "1024"], ["--n_ctx", "1024"]),
    (["--ctx-size=1024"], ["--n_ctx", "1024"]),  # issue 26: crashed the engine ('unrecognized arguments')
    (["-np", "1"], []),  # one sequence at a time: llama-cpp-python's own way
    (["-fa", "on", "--flash-attn=off"], ["--flash_attn", "true", "--flash_attn", "false"]),
    (["-ngl", "-1"], ["--n_gpu_layers", "-1"]),  # a negative number is a value
    (["--tensor-split", "3,1"], ["--tensor_split", "3", "1"]),  # its list is one word each
    (["-ctk", "q8_0", "--cache-type-v=f16"], ["--type_k", "8", "--type_v", "1"]),  # ggml type numbers
    (["--no-mmap", "-nkvo", "--mlock"], ["--use_mmap", "false", "--offload_kqv", "false", "--use_mlock", "true"]),
    (["-b", "256", "-ub=128", "-t", "4", "-s", "7"],
     ["--n_batch", "256", "--n_ubatch", "128", "--n_threads", "4", "--seed", "7"]),
    (["-sm", "row", "--rope-scaling", "yarn", "--yarn-orig-ctx", "4096"],
     ["--split_mode", "2", "--rope_scaling_type", "2", "--yarn_orig_ctx", "4096"]),
    (["--chat-template-kwargs", '{"enable_thinking": false}'], ["--chat_template_kwargs", '{"enable_thinking": false}']),
])
def test_translated_for_llama_cpp_python_and_its_parser_takes_them(words, want):
    got, problems = translate(words)
    assert (got, problems) == (want, [])
    parser = llama_cpp_python_parser()
    parser.parse_args(["--model", "m.gguf", *got])  # the real server's parser: exits on a word it does not take


def llama_cpp_python_parser() -> argparse.ArgumentParser:
    """llama-cpp-python's server's own argument parser (llama_cpp/server/__main__.py builds it so)."""
    from llama_cpp.server.cli import add_args_from_model
    from llama_cpp.server.settings import Settings

    p = argparse.ArgumentParser(exit_on_error=False)
    add_args_from_model(p, Settings)
    return p


def test_every_translation_names_a_setting_of_the_installed_server():
    import llama_cpp as lcp
    from llama_cpp.server.settings import Settings

    names = set()
    for flag, rule in RULES.items():
        value = {"-fa": "on", "--flash-attn": "on", "-np": "1", "--parallel": "1", "-sm": "row", "--split-mode": "row",
                 "--rope-scaling": "yarn", "-ctk": "f16", "--cache-type-k": "f16", "-ctv": "f16",
                 "--cache-type-v": "f16"}.get(flag, "1")
        names |= {w[2:] for w in rule(value) if w.startswith("--")}
        assert flag in llama_cpp.ALLOW, flag
    assert names - set(Settings.model_fields) == set()
    for name, number in GGML_TYPES.items():
        assert getattr(lcp, f"GGML_TYPE_{name.upper()}") == int(number), name


def test_every_flag_gpuflow_reads_is_on_the_list_or_refused():
    """vLLM's --tp, --pp, --dp: read by the scheduler (an older vLLM had them), refused as no flag
    of 0.11.0's list, so the scheduler never books from a word the engine does not read."""
    for backend, rules in ENGINES.items():
        off = [f for f in rules.PLACEMENT_INPUTS + rules.ESTIMATE_INPUTS if f not in rules.ALLOW]
        assert [f for f in off if not spec_flag_problems(backend, [f, "2"], extra=())] == []
        assert off == (["--tp", "--pp", "--dp"] if backend == "vllm" else [])
    # and each llama.cpp one, but --swa-full, reaches llama-cpp-python too
    assert [f for f in llama_cpp.PLACEMENT_INPUTS + llama_cpp.ESTIMATE_INPUTS if f not in RULES] == ["--swa-full"]


def test_the_agent_hands_llama_cpp_python_the_translation(tmp_path):
    import sys

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    req = LaunchRequest(instance="m-0", model="m", backend="llama.cpp", model_path=str(gguf), offload_layers=31,
                        backend_parameters=["--ctx-size=1024", "-fa", "off", "-ngl", "8"])
    argv = argv_for(req, 8000, EngineConfig(llama_cpp_python=sys.executable))
    assert argv[1:3] == ["-m", "llama_cpp.server"] and argv.count("--n_gpu_layers") == 1
    assert argv[-6:] == ["--n_ctx", "1024", "--flash_attn", "false", "--n_gpu_layers", "8"]  # the user's -ngl kept
    # an operator let --jinja past validation (its hosts run llama-server): this host runs
    # llama-cpp-python, so the launch is refused before any engine starts, naming the flag
    cfg = EngineConfig(llama_cpp_python=sys.executable, allow_engine_flags=("--jinja",))
    with pytest.raises(LaunchRefused, match="'--jinja' has no llama-cpp-python equivalent"):
        argv_for(req.model_copy(update={"backend_parameters": ["--jinja"]}), 8000,
                 EngineConfig(llama_cpp_python=sys.executable))
    with pytest.raises(LaunchRefused, match="'--jinja' has no llama-cpp-python equivalent"):
        argv_for(req.model_copy(update={"backend_parameters": ["--jinja"]}), 8000, cfg)
    # the same on a llama-server host: passed as written
    llama = EngineConfig(llama_server=sys.executable, allow_engine_flags=("--jinja",))
    assert argv_for(req.model_copy(update={"backend_parameters": ["--jinja"]}), 8000, llama)[-1] == "--jinja"
