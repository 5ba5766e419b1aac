"""llama-server's flags in the spelling of llama-cpp-python's server (``python -m llama_cpp.server``).

A llama.cpp model runs on llama-server or, on an agent started with ``--llama-cpp-python PY``, on
llama-cpp-python's OpenAI-compatible server; the spec is written once, in llama-server's spelling
(``-c 2048``, ``--ctx-size=2048``, ``-fa on``), and is validated before any host is known. So a
flag on llama-server's list passes validation only when this table turns it into llama-cpp-python's
settings (``llama_cpp/server/settings.py`` of llama-cpp-python 0.3.36: ``--n_ctx``,
``--flash_attn true``...), and an agent running llama-cpp-python hands the engine the translation.
A flag with no equivalent is refused at validation, saying so; an operator whose llama.cpp hosts
all run llama-server lifts that for a flag by adding it (GPUFLOW_ALLOW_ENGINE_FLAGS and ``gpuflow
agent --allow-engine-flag``), and an agent running llama-cpp-python then refuses it at launch,
before any engine starts.

| llama-server | llama-cpp-python | note |
| --- | --- | --- |
| -c, --ctx-size N | --n_ctx N | |
| -np, --parallel N | (nothing) | its server runs one sequence at a time: only 1 |
| -b, --batch-size / -ub, --ubatch-size N | --n_batch / --n_ubatch N | |
| -ctk, --cache-type-k / -ctv, --cache-type-v T | --type_k / --type_v ggml type number | not bf16 (no ggml name in 0.3.36) |
| -fa, --flash-attn on/off | --flash_attn true/false | 'auto' has none: on or off only |
| -ngl, --gpu-layers, --n-gpu-layers N | --n_gpu_layers N | |
| -ts, --tensor-split 3,1 | --tensor_split 3 1 | |
| -sm, --split-mode none/layer/row/tensor | --split_mode 0/1/2/3 | |
| -mg, --main-gpu N | --main_gpu N | |
| --no-mmap, --mmap, --mlock | --use_mmap false, --use_mmap true, --use_mlock true | |
| -nkvo, --no-kv-offload / -kvo, --kv-offload | --offload_kqv false / true | |
| -t, --threads / -tb, --threads-batch N | --n_threads / --n_threads_batch N | |
| -s, --seed N | --seed N | |
| --rope-scaling none/linear/yarn | --rope_scaling_type 0/1/2 | |
| --rope-freq-base, --rope-freq-scale, --yarn-* X | --rope_freq_base ... --yarn_beta_fast X | |
| --embedding, --embeddings | --embedding true | |
| --lora FILE | --lora_path FILE | one file only |
| --chat-template-kwargs JSON | --chat_template_kwargs JSON | |
| -v, --verbose, --log-verbose / --log-disable | --verbose true / false | |

Pure: words in, words and reasons out.
"""

from __future__ import annotations

import re
from typing import Callable

from scheduler.engine_flags import llama_cpp
from scheduler.engine_flags.check import is_flag

WHY_ANY = ("a llama.cpp spec runs on llama-server or llama-cpp-python, whichever its host has, so it may pass only "
           "flags both take")
LIFT = ("an operator whose llama.cpp hosts all run llama-server can allow the flag: GPUFLOW_ALLOW_ENGINE_FLAGS and "
        "'gpuflow agent --allow-engine-flag'")
GGML_TYPES = {"f32": "0", "f16": "1", "q4_0": "2", "q4_1": "3", "q5_0": "6", "q5_1": "7", "q8_0": "8", "iq4_nl": "20"}
ON = {"on": "true", "enabled": "true", "true": "true", "1": "true",
      "off": "false", "disabled": "false", "false": "false", "0": "false"}


class NoEquivalent(ValueError):
    """This value of the flag has no llama-cpp-python setting (the message says why)."""


Rule = Callable[[str | None], list[str]]


def same(name: str) -> Rule:
    return lambda v: [name, v]


def fixed(name: str, value: str) -> Rule:
    return lambda v: [name, value]


def mapped(name: str, table: dict[str, str], why: str) -> Rule:
    def rule(v):
        if v not in table:
            raise NoEquivalent(why)
        return [name, table[v]]
    return rule


def _parallel(v):
    if v != "1":
        raise NoEquivalent("its server runs one sequence at a time: only -np 1")
    return []


def _split(v):
    return ["--tensor_split", *[p for p in re.split(r"[,/]+", v) if p]]


def _lora(v):
    if "," in v:
        raise NoEquivalent("it takes one LoRA file, --lora_path")
    return ["--lora_path", v]


_NO_TYPE = "0.3.36 names no ggml type for it"
_K, _V = mapped("--type_k", GGML_TYPES, _NO_TYPE), mapped("--type_v", GGML_TYPES, _NO_TYPE)
_FA = mapped("--flash_attn", ON, "its --flash_attn is on or off, never auto: write -fa on or -fa off")
RULES: dict[str, Rule] = {
    "-c": same("--n_ctx"), "--ctx-size": same("--n_ctx"), "-np": _parallel, "--parallel": _parallel,
    "-b": same("--n_batch"), "--batch-size": same("--n_batch"), "-ub": same("--n_ubatch"),
    "--ubatch-size": same("--n_ubatch"),
    "-ctk": _K, "--cache-type-k": _K, "-ctv": _V, "--cache-type-v": _V,
    "-fa": _FA, "--flash-attn": _FA,
    "-ngl": same("--n_gpu_layers"), "--gpu-layers": same("--n_gpu_layers"), "--n-gpu-layers": same("--n_gpu_layers"),
    "-ts": _split, "--tensor-split": _split,
    "-sm": mapped("--split_mode", {"none": "0", "layer": "1", "row": "2", "tensor": "3"}, ""),
    "--split-mode": mapped("--split_mode", {"none": "0", "layer": "1", "row": "2", "tensor": "3"}, ""),
    "-mg": same("--main_gpu"), "--main-gpu": same("--main_gpu"),
    "--no-mmap": fixed("--use_mmap", "false"), "--mmap": fixed("--use_mmap", "true"),
    "--mlock": fixed("--use_mlock", "true"),
    "-nkvo": fixed("--offload_kqv", "false"), "--no-kv-offload": fixed("--offload_kqv", "false"),
    "-kvo": fixed("--offload_kqv", "true"), "--kv-offload": fixed("--offload_kqv", "true"),
    "-t": same("--n_threads"), "--threads": same("--n_threads"), "-tb": same("--n_threads_batch"),
    "--threads-batch": same("--n_threads_batch"), "-s": same("--seed"), "--seed": same("--seed"),
    "--rope-scaling": mapped("--rope_scaling_type", {"none": "0", "linear": "1", "yarn": "2"}, ""),
    **{f"--{k}": same(f"--{k.replace('-', '_')}") for k in (
        "rope-freq-base", "rope-freq-scale", "yarn-orig-ctx", "yarn-ext-factor", "yarn-attn-factor", "yarn-beta-slow",
        "yarn-beta-fast")},
    "--embedding": fixed("--embedding", "true"), "--embeddings": fixed("--embedding", "true"),
    "--lora": _lora, "--chat-template-kwargs": same("--chat_template_kwargs"),
    "-v": fixed("--verbose", "true"), "--verbose": fixed("--verbose", "true"), "--log-verbose": fixed("--verbose", "true"),
    "--log-disable": fixed("--verbose", "false"),
}


def _name(written: str) -> str:
    return "--" + written[2:].replace("_", "-") if written.startswith("--") else written


def translate(params: list[str], extra=(), lifted=()) -> tuple[list[str], list[str]]:
    """(llama-cpp-python's words, why each flag that has none is refused). ``params``: llama-server
    words already checked against its list; ``extra``: the operators' flags: one that is no
    llama-server flag of the list passes as written (with the words after it up to the next
    flag), as the operator's own; ``lifted``: flags whose refusal is dropped (at validation, the
    operators' flags: their hosts may all run llama-server; the agent knows, and lifts none)."""
    extra, lifted = {_name(f) for f in extra}, {_name(f) for f in lifted}
    out: list[str] = []
    problems: list[str] = []
    i = 0
    while i < len(params):
        word = params[i]
        written, eq, inline = word.partition("=")
        name = _name(written)
        allowed = llama_cpp.ALLOW.get(name)
        takes = allowed is not None and allowed.kind != "switch"
        value = inline if eq else (params[i + 1] if takes and i + 1 < len(params) else None)
        i += 1 + (takes and not eq)
        if name in extra and allowed is None:
            out.append(word)
            while not eq and allowed is None and i < len(params) and not is_flag(params[i]):
                out.append(params[i])
                i += 1
            continue
        rule = RULES.get(name)
        shown = word if eq or not takes else f"{word} {value}"
        try:
            if rule is None:
                raise NoEquivalent("its server has no such setting")
            out += rule(value)
        except NoEquivalent as e:
            if name in lifted:
                continue
            why = str(e) or f"no {value!r} there"
            problems.append(f"backend_parameters: {shown!r} has no llama-cpp-python equivalent: {why}; {WHY_ANY} "
                            f"({LIFT})")
    return out, problems
