"""Markdown helpers shared by the generated pages: tables whose cells are escaped, and the note
every generated page opens with."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

GENERATED = ("!!! note \"Generated from the code\"\n    This page is written at build time by "
             "`docs/refgen/{module}.py` from {source}; it cannot drift from the program. "
             "Edit the code (or `docs/refgen/notes.yaml`), never this page.\n")


def head(title: str, module: str, source: str, intro: str = "") -> str:
    return f"# {title}\n\n" + GENERATED.format(module=module, source=source) + (f"\n{intro}\n" if intro else "")


def cell(v: object) -> str:
    """A table cell: one line, pipes escaped, empty shown as a dash."""
    s = "" if v is None else str(v)
    s = " ".join(s.split())
    # a pipe outside a code span would end the cell; inside one it is kept as it is (and a
    # backslash there would show)
    parts = s.split("`")
    s = "`".join(p.replace("|", "\\|") if i % 2 == 0 else p for i, p in enumerate(parts))
    return s or "-"


def code(v: object) -> str:
    """Inline code for a cell; backticks inside are kept readable."""
    s = "" if v is None else str(v)
    if not s:
        return "-"
    fence = "``" if "`" in s else "`"
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    rows = list(rows)
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def first_line(doc: str | None) -> str:
    """A docstring's first paragraph, on one line."""
    if not doc:
        return ""
    return " ".join(doc.strip().split("\n\n")[0].split())
