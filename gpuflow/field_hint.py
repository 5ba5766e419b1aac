"""'did you mean ...?' for a field a spec or cluster file names but the format does not have:
the known fields at that place in the document (found by walking the pydantic model along the
error's location), matched with difflib."""

from __future__ import annotations

import difflib
import re
import types
import typing

from pydantic import BaseModel


def _models(annotation) -> list[type[BaseModel]]:
    """The pydantic models an annotation may hold: itself, or inside Optional/Union/list/dict."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list, tuple, set, dict, typing.Annotated):
        for a in typing.get_args(annotation):
            out += _models(a)
    return out


def _fields_at(model: type[BaseModel], path: tuple) -> set[str]:
    here = [model]
    for step in path:
        if not isinstance(step, str):  # a list index or a dict key: the same models one level down
            continue
        nxt: list[type[BaseModel]] = []
        for m in here:
            f = m.model_fields.get(step) or next((f for f in m.model_fields.values() if f.alias == step), None)
            if f is not None:
                nxt += _models(f.annotation)
        if nxt:
            here = nxt
    return {f.alias or n for m in here for n, f in m.model_fields.items()}


def suggestion(model: type[BaseModel], loc: tuple) -> str:
    """' (did you mean X?)' for an unknown field at ``loc``, or '' when nothing is close."""
    if not loc or not isinstance(loc[-1], str):
        return ""
    close = difflib.get_close_matches(loc[-1], sorted(_fields_at(model, tuple(loc[:-1]))), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def value_suggestion(err: dict) -> str:
    """' (did you mean X?)' for a value that is not one of an enum's or a literal's (pydantic's
    error names them in ``ctx.expected``: "'a', 'b' or 'c'"), or '' when nothing is close."""
    got, expected = err.get("input"), (err.get("ctx") or {}).get("expected")
    if not isinstance(got, str) or not isinstance(expected, str):
        return ""
    close = difflib.get_close_matches(got, re.findall(r"'([^']*)'", expected), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
