"""CLI flags made from the typed settings, so that no default is written twice: a flag's name, its
help and its default come from the field it sets.

- A field of ``gpuflow.settings.Settings`` (:func:`setting`): the help is the field's description
  (which states the default) and the variable that sets it too; the flag's own default is None,
  so that without it the environment (else the field's default) decides. The parser remembers
  which field each flag sets; :func:`apply` puts what was given into the settings.
- A field of a frozen dataclass that names its flag in ``metadata`` (:func:`dataclass_flags`:
  the agent's ``EngineConfig``, the gateway's ``GatewaySettings``): the flag's default is the
  field's, said in the help; :func:`dataclass_from` builds the object from the arguments.
  Metadata: ``flag``, ``help``, and optionally ``metavar``, ``choices``, ``dest``, ``invert``
  (a ``--no-...`` switch that turns an on-by-default field off)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, TypeVar

from pydantic import BaseModel

PATHS = "settings_paths"  # the parser's default holding {dest: "section.field"} for apply()
T = TypeVar("T")


def env_name(path: str) -> str:
    return "GPUFLOW_" + path.upper().replace(".", "__")


def setting(p: argparse.ArgumentParser, path: str, flag: str | None = None, group=None, more: str = "",
            **kw) -> argparse.Action:
    """A flag for the settings field at ``path`` ("data_dir", "temporal.address"): ``--data-dir``
    (or ``flag``); ``group``: the argument group to list it in (default ``p``); ``more``: what the
    flag's help says after the field's description."""
    from gpuflow.settings import Settings

    model: type[BaseModel] = Settings
    *sections, name = path.split(".")
    for sec in sections:
        model = model.model_fields[sec].annotation
    f = model.model_fields[name]
    if not f.description:
        raise ValueError(f"settings field {path} has no description: its flag would have no help")
    kw.setdefault("help", f"{f.description.rstrip('.')}. Or {env_name(path)}.{' ' + more if more else ''}")
    action = (group or p).add_argument(flag or "--" + name.replace("_", "-"), default=None, **kw)
    p.set_defaults(**{PATHS: {**(p.get_default(PATHS) or {}), action.dest: path}})
    return action


def apply(settings: Any, a: argparse.Namespace) -> Any:
    """``settings`` with every settings flag ``a`` was given (not None) set."""
    for dest, path in (getattr(a, PATHS, None) or {}).items():
        value = getattr(a, dest, None)
        if value is not None:
            settings = _set(settings, path.split("."), value)
    return settings


def _set(model: BaseModel, path: list[str], value: Any, top: bool = True) -> BaseModel:
    """``model`` with the field at ``path`` set; a section's field validated as the section validates
    it (a join token given as text becomes a secret), the top-level one as it is."""
    head, *rest = path
    if rest:
        return model.model_copy(update={head: _set(getattr(model, head), rest, value, False)})
    if top:
        return model.model_copy(update={head: value})
    return type(model).model_validate({**dict(model), head: value})


def dataclass_flags(p, cls: type) -> dict[str, str]:
    """A flag for each field of ``cls`` whose metadata names one; returns {field: dest}."""
    out = {}
    for f in dataclasses.fields(cls):
        m = f.metadata
        if "flag" not in m:
            continue
        kw: dict[str, Any] = {"help": m["help"], **{k: m[k] for k in ("metavar", "choices", "dest") if k in m}}
        if isinstance(f.default, bool):
            kw["action"] = "store_true"
        elif isinstance(f.default, tuple):
            kw["action"] = "append"
        else:
            kw["default"] = f.default
            if f.default is not None and not isinstance(f.default, str):
                kw["type"] = type(f.default)
            if f.default is not None:  # said here, not as %(default)s: the docs' reference shows the help as it is
                kw["help"] += f" (default {f.default or repr(f.default)})"
        out[f.name] = p.add_argument(m["flag"], **kw).dest
    return out


def dataclass_from(cls: type[T], a: argparse.Namespace, dests: dict[str, str], **more) -> T:
    """``cls`` from the flags :func:`dataclass_flags` made (and ``more``)."""
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in dests:
            v = getattr(a, dests[f.name])
            if f.metadata.get("invert"):
                v = not v
            values[f.name] = tuple(v or ()) if isinstance(f.default, tuple) else v
    return cls(**values, **more)
