"""The kinds of value an allowed engine flag takes, and how each value is checked.

A value that names a file goes through ``resolve(value, must_exist)``, given by the caller: at
spec validation a lexical check (no host is known: ``lexical`` below), on the agent the real one
(worker_agent/engines.py: relative to the model's folder, symlinks followed, inside the model's
folder or a --model-root). It returns the word to pass, an absolute path for a file, and raises
ValueError saying why not. Pure: no file is touched here.

**Hub flags** (``Flag.hub``): vLLM and SGLang read a value that names no local file as a
Hugging Face repository and download it (vLLM's --tokenizer, --hf-config-path,
--generation-config, --speculative-config's "model", --lora-modules; SGLang's --tokenizer-path,
--speculative-draft-model-path, --speculative-token-map (the repository of its folder),
--lora-paths). The engine must never get such a value: it must be written as a path
(``/abs/path``, or ``./relative`` inside the model's folder), so that spec validation refuses
``org/name`` and ``name`` (which are also relative paths) without knowing the host, and the agent
then requires the file to exist there. A hub flag's ``choices`` are its own words that name no
file (vLLM's --generation-config 'auto' and 'vllm').
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from typing import Callable

Resolve = Callable[[str, bool], str]

URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
INT = re.compile(r"-?\d{1,18}")
NUMBER = re.compile(r"-?(\d{1,18}(\.\d*)?|\.\d+)([eE][-+]?\d{1,3})?")
SIZE = re.compile(r"\d{1,18}(\.\d+)?[kKmMgGtT]?")  # vLLM's human-readable ints: 8192, 8k, 1.5M
NUMBERS = re.compile(r"\d{1,18}(\.\d+)?([,/]\d{1,18}(\.\d+)?)*")  # llama.cpp --tensor-split 3,1
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,:+=@-]{0,255}")  # no '/': never a path nor a URL
QUALNAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,255}(:[A-Za-z_][A-Za-z0-9_.]{0,255})?")
MAX_TEXT = 32768


@dataclass(frozen=True)
class Flag:
    """One allowed flag. ``kind``: switch, int, number, size, choice, name, text, numbers, path,
    paths (comma-separated), template (a file, or else text that names no file), json, lora,
    qualname. ``many``: argparse's nargs='+' (one or more words). ``code``: the engine imports
    or runs code it names, so only agents with --allow-remote-code take it. For json: ``keys``,
    the keys allowed (None: any key, whose values may name no file); ``paths``, the keys naming a
    file; ``code_keys``, keys (at any depth) that make the engine import code."""

    kind: str
    choices: tuple[str, ...] = ()
    many: bool = False
    code: bool = False
    keys: tuple[str, ...] | None = None
    paths: tuple[str, ...] = ()
    code_keys: tuple[str, ...] = ()
    hub: bool = False  # the engine downloads a value that names no local file: it must be written as a path


SWITCH, INT_, NUMBER_, SIZE_, NAME_, TEXT = (Flag(k) for k in ("switch", "int", "number", "size", "name", "text"))
PATH, PATHS, TEMPLATE, NUMBERS_, LORA = (Flag(k) for k in ("path", "paths", "template", "numbers", "lora"))
CODE_SWITCH = Flag("switch", code=True)
HUB_PATH = Flag("path", hub=True)  # a file or folder, which the engine would otherwise fetch from the hub


def choice(*values: str) -> Flag:
    return Flag("choice", choices=values)


def json_object(keys: tuple[str, ...] | None = None, paths: tuple[str, ...] = (),
                code_keys: tuple[str, ...] = (), hub: bool = False) -> Flag:
    return Flag("json", keys=keys, paths=paths, code_keys=code_keys, hub=hub)


def lexical(value: str, must_exist: bool) -> str:
    """Spec validation's resolver (no host known): a file must not climb out of the model's
    folder by '..'; absolute paths are left to the agent, which knows its --model-root."""
    if (must_exist or "/" in value) and not value.startswith("/"):
        if posixpath.normpath(value).split("/")[0] == "..":
            raise ValueError("climbs out of the model's folder ('..'); name a file inside it")
    return value


HUB_WHY = ("is read by the engine as a Hugging Face repository when no such file is on the host, and downloaded; "
           "gpuflow brings the model's files itself: write a path, ./{value} inside the model's folder or an "
           "absolute one under the host's --model-root")


def written_as_path(value: str) -> bool:
    """Whether a hub flag's value is written as a path: absolute, or relative from './'."""
    return value.startswith(("/", "./"))


def _file(value: str, resolve: Resolve, must_exist: bool, hub: bool = False) -> tuple[str, list[str]]:
    if URL.match(value):
        return value, ["is a URL: engines may not fetch from the network (gpuflow brings the model's files)"]
    if not value:
        return value, ["is empty"]
    if hub and not written_as_path(value):
        return value, [HUB_WHY.format(value=value)]
    try:
        return resolve(value, must_exist), []
    except ValueError as e:
        return value, [str(e)]


def _lora(flag: Flag, value: str, resolve: Resolve) -> tuple[str, list[str], bool]:
    """vLLM --lora-modules (NAME=PATH or JSON) and SGLang --lora-paths (PATH, NAME=PATH or JSON):
    both engines download an adapter that names no local folder (``flag.hub``)."""
    if value.lstrip().startswith("{"):
        return _json(LORA_JSON if flag.hub else LOCAL_LORA_JSON, value, resolve)
    name, eq, path = value.rpartition("=") if "=" in value else ("", "", value)
    if eq and not NAME.fullmatch(name):
        return value, [f"the adapter's name {name!r} is not a plain name"], False
    new, why = _file(path, resolve, True, flag.hub)
    return (f"{name}={new}" if eq else new), why, False


LOCAL_LORA_JSON = json_object(keys=("name", "base_model_name", "lora_name", "pinned"), paths=("path", "lora_path"))
LORA_JSON = json_object(keys=LOCAL_LORA_JSON.keys, paths=LOCAL_LORA_JSON.paths, hub=True)


def _walk(doc, depth: int = 0):
    """(key, value) at every depth of a JSON document; keys of lists' objects too."""
    if depth > 32:
        raise ValueError("is nested too deep")
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        yield k, v
        yield from _walk(v, depth + 1)


def _json(flag: Flag, value: str, resolve: Resolve) -> tuple[str, list[str], bool]:
    try:
        doc = json.loads(value)
    except ValueError:
        return value, ["is not valid JSON"], False
    if not isinstance(doc, dict):
        return value, ["must be a JSON object"], False
    problems, changed = [], False
    for k in list(doc):
        if k in flag.paths:
            if not isinstance(doc[k], str):
                problems.append(f"key {k!r} must name a file (a string)")
                continue
            new, why = _file(doc[k], resolve, True, flag.hub)
            problems += [f"key {k!r} {doc[k]!r} {w}" for w in why]
            changed |= new != doc[k]
            doc[k] = new
        elif flag.keys is not None and k not in flag.keys and k not in flag.code_keys:
            problems.append(f"key {k!r} is not one a spec may set (allowed: {', '.join(flag.keys + flag.paths)})")
    code = False
    try:
        for k, v in _walk({k: v for k, v in doc.items() if k not in flag.paths}):
            code |= k in flag.code_keys
            if isinstance(v, str) and k not in flag.code_keys and ("/" in v or "\\" in v or URL.match(v)):
                problems.append(f"{k!r}: {v!r} looks like a path or URL; only {', '.join(flag.paths) or 'no key'} may "
                                "name a file here")
    except ValueError as e:
        problems.append(str(e))
    return (json.dumps(doc) if changed else value), problems, code


def check_value(flag: Flag, value: str, resolve: Resolve) -> tuple[str, list[str], bool]:
    """(the word to pass, why it is refused, whether it makes the engine import code)."""
    if "\x00" in value:
        return value, ["holds a NUL byte"], False
    if len(value.encode()) > MAX_TEXT:
        return value, [f"is longer than {MAX_TEXT} bytes"], False
    k = flag.kind
    simple = {"int": INT, "number": NUMBER, "size": SIZE, "name": NAME, "numbers": NUMBERS, "qualname": QUALNAME}
    if k in simple:
        ok = simple[k].fullmatch(value) is not None
        return value, [] if ok else [f"is not a{'n' if k == 'int' else ''} {k.replace('qual', 'qualified ')}"], False
    if k == "choice":
        return value, [] if value in flag.choices else [f"is not one of {', '.join(flag.choices)}"], False
    if k == "text":
        return value, ["is a URL: engines may not fetch from the network"] if URL.match(value) else [], False
    if k in ("path", "template"):
        if value in flag.choices:  # a hub flag's own words (vLLM --generation-config auto)
            return value, [], False
        new, why = _file(value, resolve, k == "path", flag.hub)
        return new, why, False
    if k == "paths":
        parts = [_file(p, resolve, True) for p in value.split(",")]
        if '"' in value:
            return value, ["quotes are not allowed in a list of files"], False
        return ",".join(p for p, _ in parts), [w for _, why in parts for w in why], False
    if k == "json":
        return _json(flag, value, resolve)
    if k == "lora":
        return _lora(flag, value, resolve)
    raise AssertionError(f"unknown kind {k}")
