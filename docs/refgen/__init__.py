"""The reference pages, generated from the code at build time so they cannot drift (issue 36).

Each module makes one page's Markdown from what the program itself builds: ``cli`` from
``gpuflow.cli.parser()``, ``models`` from the pydantic models (the spec, the tenants file, the
cluster snapshot, the settings), ``metrics`` from the prometheus-client registries the control
plane, the agent and the gateway build, ``http`` from the gateway's routes and errors, and
``temporal`` from the workflow and activity definitions and ``contracts/``. ``docs/hooks.py``
hands the pages to MkDocs; a field, flag or series that cannot be documented fails the build."""

from __future__ import annotations

PAGES = {  # the page's path in the site -> the module that writes it
    "reference/cli.md": "cli",
    "reference/spec.md": "spec",
    "reference/settings.md": "settings",
    "reference/metrics.md": "metrics",
    "reference/http-api.md": "http",
    "reference/temporal.md": "temporal",
}


def render(page: str) -> str:
    """The Markdown of one generated page (a key of PAGES)."""
    import importlib

    return importlib.import_module(f"{__name__}.{PAGES[page]}").page()
