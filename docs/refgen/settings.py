"""The settings reference: ``gpuflow.settings.Settings`` (every variable, with its environment
name) and the gateway's ``GatewaySettings`` (each with the ``gpuflow gateway`` flag that sets it)."""

from __future__ import annotations

import dataclasses

from pydantic import BaseModel

from docs.refgen.md import code, head, table
from docs.refgen.spec import merged
from docs.refgen.models import bounds, comments, default, meaning, notes, type_name

HEADER = ("variable", "type (bounds)", "default", "meaning")
FLAG_OF = {"host": "listen", "port": "listen", "kv_events": "no_kv_events"}  # fields a flag sets under another name


def env_rows(model: type[BaseModel], prefix: str) -> list[tuple[str, ...]]:
    out = []
    for name, f in model.model_fields.items():
        sub = f.annotation if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel) else None
        if sub is not None:
            out += env_rows(sub, f"{prefix}{name.upper()}__")
            continue
        out.append((code(f"{prefix}{name.upper()}"), type_name(f.annotation, f.metadata), default(f), bounds(f),
                    meaning(model, name, f)))
    return out


def sections() -> list[str]:
    from gpuflow.settings import Settings

    return [n for n, f in Settings.model_fields.items()
            if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)]


def _gateway_flags() -> dict[str, str]:
    """dest -> the flag's spelling, for ``gpuflow gateway``."""
    import argparse

    from gpuflow.cli import parser

    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a.option_strings[0] for a in sub.choices["gateway"]._actions if a.option_strings}


def gateway_rows() -> list[tuple[str, ...]]:
    from gateway.config import GatewaySettings

    flags, said = _gateway_flags(), comments(GatewaySettings)
    out = []
    for f in dataclasses.fields(GatewaySettings):
        dest = FLAG_OF.get(f.name, f.name)
        flag = next((flags[d] for d in (dest, dest.removesuffix("_s"), dest.removesuffix("s")) if d in flags), None)
        if f.name == "temporal":
            flag = "the Temporal connection flags"
        text = notes().get(f"GatewaySettings.{f.name}") or f.metadata.get("help") or said.get(f.name)
        if not text:
            raise ValueError(f"gateway.config.GatewaySettings.{f.name} has no meaning to show: give it a comment, "
                             f"a metadata help, or a note 'GatewaySettings.{f.name}' in docs/refgen/notes.yaml")
        shown = f.default if f.default is not dataclasses.MISSING else "(made at start)"
        out.append((code(f.name), code(flag) if flag and flag.startswith("-") else (flag or "(not a flag)"),
                    code(shown) if shown not in ((), None) else "-", " ".join(text.split())))
    return out


def page() -> str:
    intro = ("One settings object, environment prefix `GPUFLOW_`, sections split with `__`; command-line flags "
             "override. How values are read, and what a mistake does, is in "
             "[Operations, Settings](../operations/settings.md).\n")
    from gpuflow.settings import Settings

    parts = [head("Settings reference", "settings", "`gpuflow.settings.Settings` and `gateway.config.GatewaySettings`",
                  intro)]
    top = [r for r in env_rows(Settings, "GPUFLOW_") if r[0].count("__") == 0]
    parts.append("## Top-level variables\n\n" + table(HEADER, merged(top)))
    for sec in sections():
        model = Settings.model_fields[sec].annotation
        rows = env_rows(model, f"GPUFLOW_{sec.upper()}__")
        doc = " ".join((model.__doc__ or "").split()) if model.__doc__ and "Usage docs" not in model.__doc__ else ""
        parts.append(f"## {sec}\n\n{doc}\n\nA section can be given whole as JSON "
                     f"(`GPUFLOW_{sec.upper()}='{{...}}'`); its `__` variables then override keys in it.\n\n"
                     + table(HEADER, merged(rows)))
    parts.append("## The gateway's settings\n\n`gpuflow gateway` takes its settings as flags (`gateway.config."
                 "GatewaySettings`); those marked *not a flag* are fixed for a gateway started from the CLI, and "
                 "can be set by a program that builds one (`gateway.app.build(engine, GatewaySettings(...))`).\n\n"
                 + table(("setting", "flag", "default", "meaning"), gateway_rows()))
    return "\n".join(parts)
