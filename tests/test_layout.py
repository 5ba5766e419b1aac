"""The layering in README's Layout table, checked on the source: each package's modules import only
the packages of ours it may (third-party imports are not ours and not checked). The agent's
import of activities/payloads.py, and the hub listing written twice for want of a shared home,
are what hubio/ and contracts/ replaced."""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
OURS = {"scheduler", "contracts", "hubio", "activities", "workflows", "worker_agent", "gateway", "gpuflow"}

# package: the packages of ours it may import besides itself (README, "Layout")
MAY = {
    "scheduler": set(),
    "contracts": {"scheduler"},
    "hubio": {"scheduler"},
    "activities": {"scheduler", "hubio", "contracts"},
    "worker_agent": {"scheduler", "hubio", "contracts"},
}


def imported(path: pathlib.Path) -> set[str]:
    """The top-level packages of ours that ``path`` imports, wherever the import stands."""
    tops = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            tops |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops.add(node.module.split(".")[0])
    return tops & OURS


@pytest.mark.parametrize("package", sorted(MAY))
def test_package_imports_only_what_it_may(package):
    wrong = {str(p.relative_to(ROOT)): sorted(imported(p) - MAY[package] - {package})
             for p in sorted((ROOT / package).rglob("*.py"))}
    assert {k: v for k, v in wrong.items() if v} == {}


def test_image_copies_every_package():
    # pyproject's packages.find list, e.g. "hubio*": each package must be COPY'd into the image,
    # or `pip install .` there builds a gpuflow that fails on its first import of it
    import tomllib

    listed = {p.rstrip("*") for p in tomllib.loads((ROOT / "pyproject.toml").read_text())
              ["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = {line.split()[1] for line in (ROOT / "Dockerfile").read_text().splitlines()
              if line.startswith("COPY ") and not line.split()[1].endswith((".toml", ".md"))}
    assert listed - copied == set()


# The control plane runs its workflows outside Temporal's sandbox by default (gpuflow/server.py), so
# what the sandbox would refuse at run time is refused here, on the source of the workflow modules:
# they import only these modules of the standard library and of third parties (besides ours), and
# never ask the clock.
WORKFLOW_IMPORTS = {"__future__", "asyncio", "datetime", "typing", "re", "temporalio", "pydantic"}
CLOCK_CALLS = {"now", "utcnow", "today", "time", "monotonic", "perf_counter", "time_ns"}


def test_workflow_modules_import_nothing_that_does_io():
    wrong = {}
    for p in sorted((ROOT / "workflows").rglob("*.py")):
        tree = ast.parse(p.read_text(), str(p))
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module}
        bad = sorted(m for m in names if m.split(".")[0] not in WORKFLOW_IMPORTS | OURS)
        clock = sorted({f"{ast.unparse(n.func)}()" for n in ast.walk(tree) if isinstance(n, ast.Call)
                        and isinstance(n.func, ast.Attribute) and n.func.attr in CLOCK_CALLS
                        and ast.unparse(n.func.value) != "workflow"})
        if bad or clock:
            wrong[p.name] = bad + clock
    assert wrong == {}


@pytest.mark.parametrize("source, found", [
    ("import time\n", ["time"]),  # a module outside the list
    ("from datetime import datetime\nx = datetime.now()\n", ["datetime.now()"]),  # the wall clock
    ("from temporalio import workflow\nx = workflow.now()\n", []),  # the workflow's own clock is fine
])
def test_workflow_module_check_finds(tmp_path, source, found, monkeypatch):
    (tmp_path / "workflows").mkdir()
    (tmp_path / "workflows" / "m.py").write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    if found:
        with pytest.raises(AssertionError) as e:
            test_workflow_modules_import_nothing_that_does_io()
        for f in found:
            assert f in str(e.value)
    else:
        test_workflow_modules_import_nothing_that_does_io()
