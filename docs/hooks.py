"""MkDocs hooks (mkdocs.yml ``hooks:``): the reference pages are generated from the code at build
time (docs/refgen/), so they cannot drift from the program. A field, flag or route with nothing to
say about it stops the build, naming it."""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # docs.refgen and the project's packages, wherever mkdocs runs from

from docs import refgen  # noqa: E402


def on_files(files, config):
    from mkdocs.structure.files import File

    for page in refgen.PAGES:
        files.append(File.generated(config, page, content=refgen.render(page)))
    return files
