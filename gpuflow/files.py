"""Reading the documented YAML/JSON files, with errors that name the field path. The cluster
snapshot's model (scheduler/cluster.py) is imported by ``load_cluster``: ``gpuflow deploy`` reads a
model spec only, and starts without it (issue 37)."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import yaml
from pydantic import BaseModel, ValidationError

from scheduler.errors import InvalidInput
from scheduler.spec import ModelSpec

if TYPE_CHECKING:
    from scheduler.cluster import ClusterSnapshot


def _explain(path: str, e: ValidationError, model: type[BaseModel] | None = None) -> InvalidInput:
    from gpuflow.field_hint import suggestion, value_suggestion

    lines = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        got = err.get("input")
        if err.get("type") in ("enum", "literal_error", "string_pattern_mismatch", "int_parsing", "greater_than_equal") \
                and isinstance(got, (str, int, float)):
            msg += f" (got {got!r})" + value_suggestion(err)
        if err.get("type") == "extra_forbidden" and model is not None:
            msg += suggestion(model, tuple(err["loc"]))
        lines.append(f"  {loc}: {msg}")
    return InvalidInput(f"{path}: invalid:\n" + "\n".join(lines))


# libyaml's parser where PyYAML was built with it (the wheels are): a 1,000-worker cluster file
# loads in about a third of the pure-Python parser's time. Same resolver and constructor, so the
# same values; libyaml refuses nesting past 1,000 levels itself, where the pure-Python parser
# runs out of recursion.
_BASE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MERGE = "tag:yaml.org,2002:merge"


class DuplicateKey(yaml.YAMLError):
    """A mapping names one key twice; YAML forbids it, and PyYAML would keep the last silently."""

    def __init__(self, key, line: int, first: int):
        super().__init__(f"line {line}: duplicate key {key!r} (first at line {first}); a key may appear once "
                         "in a mapping")
        self.key, self.line, self.first = key, line, first


class YamlLoader(_BASE_LOADER):  # type: ignore[misc,valid-type]
    """The safe loader (libyaml's parser where there is one), refusing a mapping that names a key
    twice, with the key and both lines. A key that a merge (``<<: *anchor``) brings in may still be
    set again in the mapping itself: that is what merges are for.

    Cheap: a mapping whose dict has as many keys as it has pairs has no duplicate, so only a
    mapping that lost a key (a duplicate, or a key a merge brings in and the mapping sets again)
    is looked at again."""

    def flatten_mapping(self, node):
        own = node.value
        super().flatten_mapping(node)  # deletes the merge keys from ``own``, then puts their pairs in front
        if node.value is not own and not hasattr(node, "own_pairs"):
            node.own_pairs = own

    def construct_mapping(self, node, deep=False):
        if not isinstance(node, yaml.MappingNode):
            return super().construct_mapping(node, deep=deep)
        self.flatten_mapping(node)
        mapping = yaml.constructor.BaseConstructor.construct_mapping(self, node, deep=deep)
        if len(mapping) < len(node.value):
            first: dict = {}
            for key_node, _ in getattr(node, "own_pairs", node.value):
                key, line = self.construct_object(key_node, deep=deep), key_node.start_mark.line + 1
                if key in first:
                    raise DuplicateKey(key, line, first[key])
                first[key] = line
        return mapping


_YAML_LOADER = YamlLoader


def load_yaml(text: str):
    """``text`` as YAML with the loader every gpuflow file is read with (duplicate keys refused)."""
    return yaml.load(text, Loader=_YAML_LOADER)
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


def _too_long(text: str, limits: dict[str, int]) -> tuple[str, int] | None:
    """The first top-level key of ``limits`` whose list in the YAML ``text`` holds more items than
    its limit, counted on the parser's events and stopped there: a file of 100,000 tenants is
    refused in a fraction of a second instead of being built whole (about 30 s) first. None when
    all are within (or the text does not parse: the loader then says why)."""
    depth, is_key, key, counting, n = 0, True, None, None, 0
    try:
        for ev in yaml.parse(text, Loader=_BASE_LOADER):
            if isinstance(ev, yaml.CollectionEndEvent):
                depth -= 1
                counting = counting if depth > 1 else None
                continue
            if not isinstance(ev, yaml.NodeEvent):
                continue  # stream and document events
            if depth == 1:  # a key or a value of the top-level mapping
                if is_key:
                    key = ev.value if isinstance(ev, yaml.ScalarEvent) else None
                elif key in limits and isinstance(ev, yaml.SequenceStartEvent):
                    counting, n = key, 0
                is_key = not is_key
            elif depth == 2 and counting is not None:
                n += 1
                if n > limits[counting]:
                    return counting, limits[counting]
            if isinstance(ev, yaml.CollectionStartEvent):
                depth += 1
    except yaml.YAMLError:
        return None
    return None


def read_document(path: str, max_items: dict[str, int] | None = None) -> dict:
    """The file's top-level mapping. ``max_items``: top-level keys whose lists may hold at most
    that many items, counted before a YAML file is built."""
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
    long = _too_long(text, max_items) if max_items and kind == "YAML" else None
    if long:
        key, most = long
        raise InvalidInput(f"{path}: invalid:\n  {key}: more than {most:,} items; at most {most:,} are allowed")
    try:
        data = json.loads(text) if kind == "JSON" else load_yaml(text)
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
    data = read_document(path, getattr(model, "MAX_ITEMS", None))
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
    from scheduler.cluster import ClusterSnapshot

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
