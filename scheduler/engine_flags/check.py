"""Reading backend_parameters word by word as the engine will, and judging each flag.

One problem per flag, the first rule that refuses it: a word that is no flag of its own; owned;
network; an abbreviation (Python engines); off the list and not widened by an operator; a value
of the wrong kind or naming a file outside the model's folder. Values are taken as the engine
takes them: llama-server reads the next word whatever it is; argparse (vLLM, SGLang) refuses a
value that starts with '-' unless it is a negative number, and nargs='+' flags take words up to
the next flag. ``--flag=value`` is one word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from scheduler.engine_flags import llama_cpp, sglang, vllm
from scheduler.engine_flags.kinds import Flag, Resolve, check_value, lexical

ENGINES = {"vllm": vllm, "sglang": sglang, "llama.cpp": llama_cpp}
NEGATIVE = re.compile(r"-\d+$|-\d*\.\d+$")  # argparse's negative numbers: values, not flags
OPERATOR_FLAG = re.compile(r"--?[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
WIDEN = ("a spec may pass only the flags listed for it (docs/formats.md, 'backend_parameters'), and those its "
         "operators added (GPUFLOW_ALLOW_ENGINE_FLAGS on the control plane, 'gpuflow agent --allow-engine-flag FLAG' "
         "on each host)")


@dataclass
class Checked:
    params: list[str] = field(default_factory=list)  # the words to pass: files resolved
    problems: list[str] = field(default_factory=list)
    code: list[str] = field(default_factory=list)  # the flags (as written) that make the engine import code


def is_flag(word: str) -> bool:
    return word.startswith("-") and word != "-" and not NEGATIVE.match(word)


def normal(backend: str, written: str) -> str:
    """The flag as the engine reads it: '_' is '-' in long flags where the engine does that (vLLM
    and llama-server); SGLang's plain argparse refuses the '_' form, so it stays as written (and
    is refused as no flag of the list, naming the spelling to write)."""
    rules = ENGINES.get(backend)
    if rules is not None and not rules.UNDERSCORE:
        return written
    return "--" + written[2:].replace("_", "-") if written.startswith("--") else written


def _abbreviates(rules, name: str, flags) -> str | None:
    """The flag of ``flags`` that ``name`` is, or that argparse would read it as (a prefix of a
    long flag; never when ``name`` is a flag itself: argparse takes an exact match first)."""
    if name in flags:
        return name
    if rules.ARGPARSE and name.startswith("--") and len(name) > 3 and name not in rules.ALLOW:
        return next((f for f in flags if f.startswith("--") and f.startswith(name)), None)
    return None


def refused(backend: str, written: str) -> str | None:
    """Why this flag is refused whatever the host and whatever an operator added."""
    rules, name = ENGINES[backend], normal(backend, written)
    if (f := _abbreviates(rules, written, rules.OWNED) or _abbreviates(rules, name, rules.OWNED)) is not None:
        return (f"backend_parameters: {written!r} sets {f}, which a spec may not set (gpuflow sets it from the "
                "placement, or it reaches files outside the instance); remove it")
    if (f := _abbreviates(rules, name, rules.NETWORK)) is not None:
        return (f"backend_parameters: {written!r}{'' if f == written else f' ({f})'} makes the engine fetch from the "
                "network; gpuflow brings the model's files itself, so this is refused on every host")
    reads = rules.PLACEMENT_INPUTS + rules.ESTIMATE_INPUTS
    if name not in reads and (f := _abbreviates(rules, name, reads)) is not None:
        return (f"backend_parameters: {written!r} abbreviates {f}; write {f} in full (gpuflow reads it to book "
                "the placement)")
    if name in reads and written != name:
        return (f"backend_parameters: {written!r} is {backend}'s other spelling of {name}; write {name} (gpuflow reads "
                "that spelling to book the placement)")
    return None


def unlisted(backend: str, written: str, name: str) -> str:
    """Why a flag off the list is refused: an abbreviation of a listed flag (argparse engines take
    a long flag's unambiguous prefix; gpuflow judges only full spellings), SGLang's '_' form of a
    listed flag, or no listed flag at all."""
    rules = ENGINES[backend]
    if (f := _abbreviates(rules, name, rules.ALLOW)) is not None and f != name:
        return (f"backend_parameters: {written!r} abbreviates {f}; write {f} in full ({backend} reads a prefix as "
                "the flag it starts, gpuflow checks flags only by their full names)")
    dashed = "--" + written[2:].replace("_", "-") if written.startswith("--") else written
    if dashed != written and dashed in rules.ALLOW:
        return f"backend_parameters: {written!r}: {backend} reads only {dashed} (with '-', not '_'); write {dashed}"
    return f"backend_parameters: {written!r} is not a {backend} flag a spec may pass; {WIDEN}"


def _values(rules, rule: Flag | None, params: list[str], i: int) -> tuple[list[str], int]:
    """The words after params[i-1] that belong to its flag, and the index after them."""
    if rule is not None and not rules.ARGPARSE:
        return (params[i:i + 1], i + 1)
    out = []
    while i < len(params) and isinstance(params[i], str) and not is_flag(params[i]):
        out.append(params[i])
        i += 1
        if rule is not None and not rule.many:
            break
    return out, i


def check_flags(backend: str, params: list, extra=(), resolve: Resolve = lexical) -> Checked:
    """Every flag of ``params`` judged for ``backend``; ``extra``: the flags operators added."""
    rules = ENGINES.get(backend)
    if rules is None:  # custom: run_command is the operator's (agent --allow-custom)
        return Checked(params=list(params))
    out, i = Checked(), 0
    extra = {normal(backend, f) for f in extra}
    while i < len(params):
        word = params[i]
        i += 1
        if not isinstance(word, str) or "\x00" in word:
            out.problems.append(f"backend_parameters: {word!r} is not a plain string (text without NUL)")
            continue
        written, eq, inline = word.partition("=") if is_flag(word) else (word, "", "")
        if not is_flag(word) or any(c.isspace() for c in written):
            out.problems.append(f"backend_parameters: {word!r} is not a flag, nor the value of one; give each flag "
                                "and each value as its own item, values right after their flag")
            continue
        name = normal(backend, written)
        rule = rules.ALLOW.get(name)
        why = refused(backend, written)
        if why is None and rule is None and name not in extra:
            why = unlisted(backend, written, name)
        if why is not None or rule is None:  # refused, or an operator's: its values are not ours to type
            values, i = ([], i) if eq else _values(rules, None, params, i)
            if why is not None:
                out.problems.append(why)
            else:
                out.params += [word, *values]
            continue
        if rule.code:
            out.code.append(word)
        if rule.kind == "switch":
            if eq:
                out.problems.append(f"backend_parameters: {word!r}: {written} takes no value")
            out.params.append(word)
            continue
        values, i = ([inline], i) if eq else _values(rules, rule, params, i)
        if not values:
            out.problems.append(f"backend_parameters: {written} needs a value")
            continue
        passed = []
        for v in values:
            new, whys, code = check_value(rule, v, resolve)
            out.problems += [f"backend_parameters: {written} {v!r} {w}" for w in whys]
            if code and word not in out.code:
                out.code.append(word)
            passed.append(new)
        out.params += [f"{written}={passed[0]}"] if eq else [written, *passed]
    return out
