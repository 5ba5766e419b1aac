"""Which engine flags a model spec's ``backend_parameters`` may carry: an allowlist per engine.

Anyone who can deploy writes the spec, and the engine runs as the agent's user, so a flag is
where a deployer could make a host read a file, import code or fetch from the network. A
denylist misses the next flag (an outside probe got JSON-held paths, relative files, imported
classes and URLs past one), so each engine has a list of the flags a spec may pass, with the
kind of each value (``kinds.py``): vLLM 0.11.0 (``vllm.py``), SGLang 0.5.3 (``sglang.py``),
llama-server as vendored by llama-cpp-python 0.3.36 (``llama_cpp.py``; pyproject pins that
package, and names no vLLM or SGLang version). tests/data/engine_flags/ holds each engine's own
flag list, read from its source, and tests/test_engine_flags_allowlist.py checks every listed
flag against it.

The rule, flag by flag (``check.check_flags``):
1. **owned** flags are refused everywhere: what gpuflow sets from the placement (host, port,
   model, served name, how nodes meet, KV bytes past the booked share) and what reads more
   flags or files from elsewhere (--config, --download-dir, --log-file...).
2. **network** flags are refused everywhere, whatever an operator adds: llama.cpp's -mu,
   -mmu, -hf*, -dr, --spec-draft-hf..., vLLM's --tool-server, and any value that is a URL.
3. **placement inputs** (parallel sizes, the memory share, -ngl, --tensor-split) pass, spelled
   in full: the scheduler books the placement from them.
4. A flag **on the list** passes when its value is of its kind. A file (a chat template, a
   tokenizer, a LoRA, a draft model, a path-valued key of a JSON value such as
   --speculative-config's "model") must lie in the model's folder, where a relative path is
   resolved, or under the agent's --model-root; the agent passes it on as an absolute path.
   JSON values take only the keys listed, and no other string in them may look like a path.
5. A flag **off the list** is refused, naming it, unless an operator added it: the control
   plane's (GPUFLOW_ALLOW_ENGINE_FLAGS, through ``allow_more``: what specs may name at all) and
   each host's (``gpuflow agent --allow-engine-flag FLAG``: what that host runs). Such a flag
   passes with its values as written (the agent still refuses words naming a file outside the
   model's folder). Operators widen with exact spellings; owned and network flags stay refused.
6. Flags that **import code** (--trust-remote-code, vLLM's --worker-extension-cls, --worker-cls,
   --middleware, --logits-processors, --tool-parser-plugin, --hf-overrides with "auto_map",
   SGLang's --enable-custom-logit-processor...) pass spec validation and run only on agents
   started with --allow-remote-code.

At spec validation no host is known: files are checked lexically (no '..' out of the model's
folder; absolute paths are the agent's to judge), and the operator's flags are the control
plane's. The agent checks again, with its own --allow-engine-flag and its files.

vLLM and llama-server read '_' as '-' in long flags (SGLang does not: there '--tp_size' is refused
naming '--tp-size'); vLLM and SGLang (argparse) take any unambiguous prefix of a long flag. Only
full spellings are on the lists, so an abbreviation is refused at validation, naming the flag it
abbreviates: gpuflow reads flags (``scheduler/params.py``) only as written in full, and reading an
abbreviation as its flag would need each engine version's whole flag list to know what a prefix
means. The flags gpuflow reads (PLACEMENT_INPUTS, llama.cpp's ESTIMATE_INPUTS) pass only in the
spellings gpuflow reads: every one llama-server documents (-c and --ctx-size, -np and --parallel,
-ngl, --gpu-layers and --n-gpu-layers, -ts and --tensor-split, -fa and --flash-attn...), not their
'_' forms. ``--flag value`` and ``--flag=value`` are both read; negative numbers are values.

llama.cpp specs are also checked against llama-cpp-python's server (``llama_cpp_python.py``): an
agent may serve llama.cpp models with it, and it has its own names (--n_ctx for --ctx-size); a
flag it has no equivalent for is refused at validation, never at the engine's start.
"""

from __future__ import annotations

from functools import lru_cache

from scheduler.engine_flags import llama_cpp_python
from scheduler.engine_flags.check import ENGINES, OPERATOR_FLAG, Checked, check_flags, normal, refused
from scheduler.engine_flags.kinds import lexical

__all__ = ["ENGINES", "Checked", "allow_flag_problem", "allow_more", "check_flags", "flag_problems",
           "operator_flags", "remote_code_flags", "spec_flag_problems"]

_OPERATOR: tuple[str, ...] = ()  # this process's extra flags: see allow_more


def allow_flag_problem(flag: str) -> str | None:
    """An operator's flag: one flag, spelled exactly (no value, no pattern)."""
    if not isinstance(flag, str) or not OPERATOR_FLAG.fullmatch(flag):
        return (f"--allow-engine-flag {flag!r}: give one flag as the engine spells it, such as --max-num-seqs or "
                "-ngld (no value, no wildcard)")
    return None


def allow_more(flags) -> None:
    """The control plane's operator widens what specs may pass, for this process, once at start
    (GPUFLOW_ALLOW_ENGINE_FLAGS). Only widen it: a running workflow that validated a flag must
    validate it again when replayed."""
    global _OPERATOR
    bad = [why for f in flags if (why := allow_flag_problem(f))]
    if bad:
        raise ValueError("GPUFLOW_ALLOW_ENGINE_FLAGS: " + "; ".join(bad))
    _OPERATOR = tuple(flags)


def operator_flags() -> tuple[str, ...]:
    return _OPERATOR


def spec_flag_problems(backend: str, params: list, extra: tuple[str, ...] | None = None) -> list[str]:
    """Why these backend_parameters are refused at spec validation (no host known). A llama.cpp
    spec may run on llama-cpp-python's server too, so each of its flags must have an equivalent
    there (``llama_cpp_python.py``), unless an operator added the flag."""
    extra = operator_flags() if extra is None else extra
    if not all(isinstance(w, str) for w in params):  # validated specs hold words; anything else is not kept
        return _spec_flag_problems(backend, params, extra)
    return list(_kept_problems(backend, tuple(params), tuple(extra)))


@lru_cache(maxsize=256)
def _kept_problems(backend: str, params: tuple[str, ...], extra: tuple[str, ...]) -> tuple[str, ...]:
    """Kept per (backend, parameters, operator flags): every replica's workflow validates its
    deployment's spec, so a burst checked the same few lists thousands of times (issue 37)."""
    return tuple(_spec_flag_problems(backend, list(params), extra))


def _spec_flag_problems(backend: str, params: list, extra: tuple[str, ...]) -> list[str]:
    checked = check_flags(backend, params, extra, lexical)
    if backend == "llama.cpp":
        return checked.problems + llama_cpp_python.translate(checked.params, extra, lifted=extra)[1]
    return checked.problems


def _flags(backend: str, params: list) -> list[tuple[str, str]]:
    return [(w, w.split("=", 1)[0]) for w in params if isinstance(w, str) and w.strip() and w.startswith("-")
            and w != "-" and not w[1:2].isdigit() and not w[1:2] == "."]


def flag_problems(backend: str, params: list) -> list[str]:
    """Only the refusals no operator can lift: owned flags, network flags, and placement inputs
    spelled in a way the scheduler does not read (the whole check: ``spec_flag_problems``)."""
    if backend not in ENGINES:
        return []
    return [why for word, written in _flags(backend, params) if (why := refused(backend, written.split()[0]))]


def remote_code_flags(backend: str, params: list) -> list[str]:
    """The flags (as written) that make the engine run code from the model's files or requests,
    abbreviations included."""
    rules = ENGINES.get(backend)
    if rules is None:
        return []
    code = tuple(f for f, rule in rules.ALLOW.items() if rule.code)
    out = []
    for word, written in _flags(backend, params):
        name = normal(backend, written)
        if name in code or (rules.ARGPARSE and len(name) > 3 and any(f.startswith(name) for f in code if
                                                                       f.startswith("--"))):
            out.append(word)
    return out
