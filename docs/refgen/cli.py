"""The CLI reference: every command and flag, walked from ``gpuflow.cli.parser()``, the parser
``gpuflow`` itself runs. An argument group several commands share (the Temporal connection
flags) is listed once, and named where it applies."""

from __future__ import annotations

import argparse

from docs.refgen.md import code, head, table

SHARED_MIN = 3  # a group with the same flags in at least this many commands is listed once


def commands(p: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str, argparse.ArgumentParser]]:
    """(command path, its one-line help, its parser), depth first, in the parser's order."""
    out = []
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            helps = {c.dest: c.help or "" for c in a._choices_actions}
            for name, sub in a.choices.items():
                out.append(((*path, name), helps.get(name, ""), sub))
                out += commands(sub, (*path, name))
    return out


def options(p: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every argument a user can give this parser (not -h, not its subcommands)."""
    return [a for a in p._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def _name(a: argparse.Action) -> str:
    if a.option_strings:
        flags = ", ".join(a.option_strings)
        if a.nargs == 0:
            return flags
        return f"{flags} {a.metavar or a.dest.upper()}"
    if a.choices:
        return "|".join(map(str, a.choices))
    return str(a.metavar or a.dest)


def _default(a: argparse.Action) -> str:
    if a.nargs == 0:  # a switch: given or not (a store_false switch is "on" until given)
        return "on" if a.default is True and not isinstance(a, argparse._StoreFalseAction) else "off"
    if a.default in (None, argparse.SUPPRESS) or a.default == []:
        return "-" if not a.required else "required"
    return code(a.default)


def _meaning(a: argparse.Action) -> str:
    bits = [a.help if a.help and a.help != argparse.SUPPRESS else ""]
    if a.choices and a.option_strings:
        bits.append("one of " + ", ".join(f"`{c}`" for c in a.choices))
    if isinstance(a, argparse._AppendAction):
        bits.append("repeatable")
    if not a.option_strings and a.nargs in ("*", "+"):
        bits.append("one or more" if a.nargs == "+" else "any number")
    return "; ".join(b for b in bits if b) or "-"


def _rows(actions) -> list[tuple[str, str, str]]:
    return [(code(_name(a)), _default(a), _meaning(a)) for a in actions]


def _signature(group: argparse._ArgumentGroup) -> tuple:
    return (group.title, tuple(tuple(a.option_strings) for a in group._group_actions))


def shared_groups(cmds) -> dict[tuple, argparse._ArgumentGroup]:
    """Argument groups with a title that many commands share, keyed by their signature."""
    seen: dict[tuple, list] = {}
    for _, _, p in cmds:
        for g in p._action_groups:
            if g.title not in ("positional arguments", "options", "optional arguments") and g._group_actions:
                seen.setdefault(_signature(g), []).append(g)
    return {sig: gs[0] for sig, gs in seen.items() if len(gs) >= SHARED_MIN}


def _anchor(title: str) -> str:
    """The id the toc extension gives a heading with this title."""
    from markdown.extensions.toc import slugify

    return slugify(title, "-")


def section(path, help_, p, shared) -> str:
    name = " ".join(("gpuflow", *path))
    out = [f"## {name}\n", f"{help_}\n" if help_ else ""]
    if p.description:
        out.append(" ".join(p.description.split()) + "\n")
    usage = " ".join(p.format_usage().split())
    out.append(f"```\n{usage}\n```\n")
    listed, notes = [], []
    for g in p._action_groups:
        if _signature(g) in shared:
            notes.append(f"Also the [{g.title} flags](#{_anchor(g.title)}).")
            continue
        listed += [a for a in g._group_actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
    if listed:
        out.append(table(("argument", "default", "meaning"), _rows(listed)))
    out += [n + "\n" for n in notes]
    return "\n".join(x for x in out if x)


def page() -> str:
    from gpuflow.cli import parser

    root = parser()
    cmds = commands(root)
    shared = shared_groups(cmds)
    intro = (" ".join((root.description or "").split()) + ".\n\n```\n" + (root.epilog or "") + "\n```\n\n"
             "Every command below, with every flag it takes, as `gpuflow COMMAND --help` prints it.\n")
    parts = [head("CLI reference", "cli", "`gpuflow.cli.parser()`", intro)]
    for g in shared.values():
        parts.append(f"## {g.title}\n\nFlags several commands share; each command below says where they apply.\n\n"
                     + table(("flag", "default", "meaning"), _rows(g._group_actions)))
    parts += [section(path, h, p, shared) for path, h, p in cmds]
    return "\n".join(parts)
