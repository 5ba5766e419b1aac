"""Reading the documented YAML/JSON files, with errors that name the field path."""

from __future__ import annotations

import json
import os

import yaml
from pydantic import BaseModel, ValidationError

from scheduler.cluster import ClusterSnapshot
from scheduler.errors import InvalidInput
from scheduler.spec import ModelSpec


def _explain(path: str, e: ValidationError, model: type[BaseModel] | None = None) -> InvalidInput:
    from gpuflow.field_hint import suggestion

    lines = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        got = err.get("input")
        if err.get("type") in ("enum", "literal_error", "string_pattern_mismatch", "int_parsing", "greater_than_equal") \
                and isinstance(got, (str, int, float)):
            msg += f" (got {got!r})"
        if err.get("type") == "extra_forbidden" and model is not None:
            msg += suggestion(model, tuple(err["loc"]))
        lines.append(f"  {loc}: {msg}")
    return InvalidInput(f"{path}: invalid:\n" + "\n".join(lines))


# libyaml's parser where PyYAML was built with it (the wheels are): a 1,000-worker cluster file
# loads in about a third of the pure-Python parser's time. Same resolver and constructor, so the
# same values; libyaml refuses nesting past 1,000 levels itself, where the pure-Python parser
# runs out of recursion.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_FILE_BYTES = 64 << 20
MAX_DEPTH = 64  # the formats nest a few levels; far deeper is a mistake or an attack
MAX_VALUES = 1_000_000  # YAML aliases can make a small file expand to billions of values


def _check_shape(path: str, data) -> None:
    """Refuse a document nested deeper than MAX_DEPTH or, aliases expanded, holding more than
    MAX_VALUES values, before validation walks it."""
    stack, seen = [(data, 1)], 0
    while stack:
        v, depth = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise InvalidInput(f"{path}: more than {MAX_VALUES:,} values (YAML aliases expanded); refused")
        if isinstance(v, (dict, list)):
            if depth > MAX_DEPTH:
                raise InvalidInput(f"{path}: nested more than {MAX_DEPTH} levels deep; refused")
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))


def read_document(path: str) -> dict:
    kind = "JSON" if path.endswith(".json") else "YAML"
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise InvalidInput(f"{path}: cannot read: {e.strerror or e}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise InvalidInput(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB; refused")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise InvalidInput(f"{path}: not UTF-8 text: byte {raw[e.start]:#04x} at offset {e.start} (line {line})") from None
    try:
        data = json.loads(text) if kind == "JSON" else yaml.load(text, Loader=_YAML_LOADER)
    except yaml.YAMLError as e:
        if "maximum nesting depth" in str(e):
            raise InvalidInput(f"{path}: not valid YAML: nested too deeply to read ({str(e).splitlines()[-1].strip()})") from None
        raise InvalidInput(f"{path}: not valid {kind}: {e}") from None
    except json.JSONDecodeError as e:
        raise InvalidInput(f"{path}: not valid {kind}: {e}") from None
    except RecursionError:
        raise InvalidInput(f"{path}: not valid {kind}: nested too deeply to read") from None
    _check_shape(path, data)
    if not isinstance(data, dict):
        raise InvalidInput(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def load(path: str, model: type[BaseModel]):
    if path.endswith(".json"):
        obj = _load_json_fast(path, model)
        if obj is not None:
            return obj
    data = read_document(path)
    try:
        obj = model.model_validate(data)
    except ValidationError as e:
        raise _explain(path, e, model) from None
    return obj


def _load_json_fast(path: str, model: type[BaseModel]):
    """A JSON file validated by pydantic's JSON parser in one pass (a 1,000-worker cluster in a
    fraction of json.loads + model_validate). None when it does not validate: the slow path then
    reads it again and names the problem exactly as for YAML, and refuses a file over the size limit."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            return None
        return model.model_validate_json(raw)
    except (OSError, ValidationError):
        return None


def load_cluster(path: str) -> ClusterSnapshot:
    return load(path, ClusterSnapshot)


def load_spec(path: str) -> ModelSpec:
    return load(path, ModelSpec)


def model_files_path(spec: ModelSpec, spec_file: str, override: str | None = None) -> str | None:
    """Where the model's files are on this machine: --model-path, else local_path (relative to
    the spec file). The spec itself is left as written, so it matches model_files rows."""
    if override:
        return override
    lp = spec.source.local_path
    if lp and not os.path.isabs(lp):
        return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(spec_file)), lp))
    return lp
