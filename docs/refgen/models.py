"""Field tables from pydantic models: every field with its type, default, bounds and meaning, nested
models walked with their path (``gpu_selector.gpu_ids``, ``rules[].up_step``).

A field's meaning is, first found: a note in ``notes.yaml`` (``Class.field``: the fuller text the
spec's pages had), the field's ``description``, or the comment on its line in the source. A field
with none of them stops the build, naming it: a new field is documented or the docs do not build."""

from __future__ import annotations

import enum
import functools
import inspect
import io
import os
import pathlib
import tokenize
import types
import typing

import yaml
from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo

NOTES = pathlib.Path(__file__).with_name("notes.yaml")


class Undocumented(Exception):
    pass


@functools.cache
def notes() -> dict[str, str]:
    return yaml.safe_load(NOTES.read_text()) or {}


@functools.cache
def comments(cls: type) -> dict[str, str]:
    """``field: comment`` for the class body's fields: the comment at the end of its line (and
    comment lines below it, indented deeper, that continue it), else the comment lines right above
    it at its own indentation."""
    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    last, above = None, []  # the field a deeper comment continues; comment lines waiting for a field
    lines: dict[int, list] = {}
    for t in tokenize.generate_tokens(io.StringIO(src).readline):
        lines.setdefault(t.start[0], []).append(t)
    for n in sorted(lines):
        toks = [t for t in lines[n] if t.type not in (tokenize.INDENT, tokenize.DEDENT, tokenize.NL, tokenize.NEWLINE)]
        if not toks:
            last, above = None, []
            continue
        text = toks[-1].string.lstrip("#").strip() if toks[-1].type == tokenize.COMMENT else ""
        if len(toks) == 1 and text:
            at = toks[0].start[1] + len(toks[0].string) - len(toks[0].string.lstrip("#").lstrip())
            if last is not None and at > field_col + 2:  # its text aligned under the field's comment
                out[last] += " " + text
            else:
                last, above = None, [*above, text]
            continue
        last = None
        if len(toks) > 2 and toks[0].type == tokenize.NAME and toks[1].string == ":":
            said = text or " ".join(above)
            if said:
                out[toks[0].string] = said
            last, field_col = (toks[0].string, toks[0].start[1]) if text else (None, 0)
        above = []
    return out


def meaning(cls: type, name: str, f: FieldInfo) -> str:
    text = notes().get(f"{cls.__name__}.{name}") or f.description or comments(cls).get(name)
    if not text:
        raise Undocumented(f"{cls.__module__}.{cls.__name__}.{name} has no meaning to show: give it a "
                           f"description, or add '{cls.__name__}.{name}' to docs/refgen/notes.yaml")
    return " ".join(str(text).split())


def _is_bytes(meta) -> bool:
    return any(getattr(getattr(m, "func", None), "__name__", "") == "parse_bytes" for m in meta)


def type_name(tp, meta=()) -> str:
    """A type as a reader writes the value: ``bytes`` (with units), ``int``, ``a|b`` choices."""
    if _is_bytes(meta):
        return "bytes"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return type_name(args[0], (*meta, *args[1:]))
    if origin in (typing.Union, types.UnionType):
        shown = [type_name(a, meta) for a in args if a is not type(None)]
        return " or ".join(dict.fromkeys(shown))
    if origin is typing.Literal:
        return "|".join(str(a) for a in args)
    if origin in (list, tuple, set, frozenset):
        return f"list of {type_name(args[0]) if args else 'any'}"
    if origin is dict:
        return f"map {type_name(args[0])} → {type_name(args[1])}" if args else "map"
    if inspect.isclass(tp) and issubclass(tp, enum.Enum):
        return "|".join(str(m.value) for m in tp)
    if inspect.isclass(tp) and issubclass(tp, BaseModel):
        return "object"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp)).replace("typing.", "")


def bounds(f: FieldInfo) -> str:
    """A field's bounds, short: ``0..4,096``, ``> 0``, ``at most 512``, a pattern."""
    lo = hi = None
    out = []
    for m in f.metadata:
        for kind, attr, word in ((Ge, "ge", ">="), (Gt, "gt", ">"), (Le, "le", "<="), (Lt, "lt", "<")):
            if isinstance(m, kind):
                v = getattr(m, attr)
                shown = f"{v:,}" if isinstance(v, int) else f"{v:g}"
                if kind in (Ge, Gt):
                    lo = (word, shown)
                else:
                    hi = (word, shown)
        if isinstance(m, MaxLen):
            out.append(f"at most {m.max_length:,}")
        if isinstance(m, MinLen) and m.min_length:
            out.append(f"at least {m.min_length:,}")
        pattern = getattr(m, "pattern", None)
        if isinstance(pattern, str):
            out.append(f"`{pattern}`")
    if lo and hi and lo[0] == ">=" and hi[0] == "<=":
        out.insert(0, f"{lo[1]}..{hi[1]}")
    else:
        out[:0] = [f"{b[0]} {b[1]}" for b in (lo, hi) if b]
    return "; ".join(out)


def default(f: FieldInfo) -> str:
    if f.is_required():
        return "required"
    v = f.get_default(call_default_factory=True)
    if isinstance(v, BaseModel):
        return "see below" if type(v).model_fields else "{}"
    if isinstance(v, enum.Enum):
        v = v.value
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str) and v.startswith(os.path.expanduser("~") + os.sep):
        v = "~" + v[len(os.path.expanduser("~")):]  # a default made from the home folder: as the reader's
    if isinstance(v, list) and v and isinstance(v[0], BaseModel):
        return "[" + ", ".join(getattr(x, "kind", type(x).__name__) for x in v) + "]"
    return f"`{v!r}`" if isinstance(v, str) else f"`{v}`"


def nested(tp) -> list[tuple[type, str]]:
    """The models a field holds, with the path suffix that reaches them ('' or '[]' or '{}')."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return nested(args[0])
    if origin in (typing.Union, types.UnionType):
        return [m for a in args for m in nested(a)]
    if origin in (list, tuple, set):
        return [(m, "[]" + s) for a in args[:1] for m, s in nested(a)]
    if origin is dict and args:
        return [(m, "{}" + s) for m, s in nested(args[1])]
    if inspect.isclass(tp) and issubclass(tp, BaseModel):
        return [(tp, "")]
    return []


def rows(cls: type[BaseModel], prefix: str = "", seen: dict | None = None) -> list[tuple[str, ...]]:
    """One row per field, nested models' fields after their parent's row. A model met again under
    another path (a draft model is a source) is not repeated: its row says where its fields are."""
    seen = {} if seen is None else seen
    out = []
    for name, f in cls.model_fields.items():
        path = f"{prefix}{name}"
        row = [f"`{path}`", type_name(f.annotation, f.metadata), default(f), bounds(f), meaning(cls, name, f)]
        out.append(row)
        models = nested(f.annotation)
        for m, suffix in models:
            if m in seen:
                row[4] += f" (its fields: as `{seen[m]}`)"
                continue
            sub = f"{path}{suffix}"
            if len(models) > 1 and "kind" in m.model_fields:  # a tagged union: one block per kind
                sub = f"{path}{suffix.rstrip('[]')}[kind={m.model_fields['kind'].default}]"
            else:
                seen[m] = sub
            out += rows(m, sub + ".", seen)
    return [tuple(r) for r in out]


def fields(cls: type[BaseModel]) -> list[str]:
    """Every field path of a model, as its table names them (for the docs' tests)."""
    return [r[0].strip("`") for r in rows(cls)]
