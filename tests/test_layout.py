"""The layering in docs/developer/layout.md's table, checked on the source: each package's modules
import only the packages of ours they may, directly and through every module they import in turn;
and no workflow module reaches an HTTP client, a database library or ``temporalio.client``, however
indirectly. Every top-level package has its own row, and no row an exception: a rule is kept by
moving the code, never by widening this test (the agent's import of activities/payloads.py and the
hub listing written twice became hubio/ and contracts/; the console's imports of CLI modules and
gpuflow's Temporal helpers became views/ and the console's ControlPlane seam)."""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
OURS = {"scheduler", "contracts", "hubio", "store", "views", "activities", "workflows", "worker_agent", "gateway",
        "console", "gpuflow"}

# package: the packages of ours it may import besides itself (docs/developer/layout.md)
MAY = {
    "scheduler": set(),
    "contracts": {"scheduler"},
    "hubio": {"scheduler"},
    "store": {"scheduler", "contracts"},
    "views": {"scheduler", "contracts", "store"},  # what the CLI and the console show, read from the store
    "activities": {"scheduler", "hubio", "contracts", "store", "views"},  # the reads answer with the views
    "workflows": {"scheduler", "contracts"},
    "worker_agent": {"scheduler", "hubio", "contracts"},
    "gateway": {"scheduler", "contracts", "store"},
    # the web console: served by a gateway's process, over the views; the control plane only through
    # the seam it is handed (console/plane.py): no Temporal client, no CLI module
    "console": {"scheduler", "contracts", "store", "gateway", "views"},
    "gpuflow": OURS - {"gpuflow"},  # the CLI and the processes: it wires everything
}


def package_of(module: str) -> str:
    return module.split(".")[0]


# What no workflow module may reach, even through the modules it imports: I/O has no place in a
# workflow (it runs in the workflow task, replayed), and these are the libraries that do it.
NO_IO = {"aiohttp", "httpx", "requests", "urllib3", "sqlalchemy", "sqlmodel", "psycopg", "psycopg2", "asyncpg",
         "sqlite3", "temporalio.client", "temporalio.worker", "temporalio.service", "socket", "subprocess"}


def import_names(path: pathlib.Path) -> set[str]:
    """Every dotted name ``path`` imports, wherever the import stands: ``import a.b`` gives a.b;
    ``from a import b`` gives a, and a.b (b may be a module)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def imported(path: pathlib.Path) -> set[str]:
    """The top-level packages of ours that ``path`` imports."""
    return {n.split(".")[0] for n in import_names(path)} & OURS


def modules() -> dict[str, pathlib.Path]:
    """Every module of ours, by dotted name (a package by its own name, for its __init__.py)."""
    out = {}
    for top in OURS:
        for p in (ROOT / top).rglob("*.py"):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def imports_of(path: pathlib.Path, known: dict[str, pathlib.Path]) -> tuple[set[str], set[str]]:
    """(modules of ours, other names) that ``path`` imports (import_names)."""
    names = import_names(path)
    return {n for n in names if n in known}, {n for n in names if n.split(".")[0] not in OURS}


def reach(start: str, known: dict[str, pathlib.Path]) -> tuple[set[str], set[str]]:
    """Every module of ours ``start`` imports, however indirectly, and the other modules they import."""
    seen, other, todo = set(), set(), [start]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        ours, more = imports_of(known[m], known)
        other |= more
        todo += [n for n in ours if n not in seen]
        parent = m.rpartition(".")[0]  # importing a.b runs a/__init__.py first
        if parent and parent in known and parent not in seen:
            todo.append(parent)
    return seen - {start}, other


@pytest.mark.parametrize("package", sorted(MAY))
def test_package_imports_only_what_it_may(package):
    known = modules()
    wrong = {}
    for m in sorted(k for k in known if package_of(k) == package):
        names = import_names(known[m])
        bad = {n.split(".")[0] for n in names if n.split(".")[0] in OURS} - MAY[package] - {package}
        if bad:
            wrong[m] = sorted(bad)
    assert wrong == {}


@pytest.mark.parametrize("package", sorted(set(MAY) - {"gpuflow"}))
def test_package_reaches_only_what_it_may(package):
    # transitively: a module of a package it may import must not bring in one it may not
    known = modules()
    allowed = MAY[package] | {package}
    wrong = {}
    for m in sorted(k for k in known if package_of(k) == package):
        bad = sorted(n for n in reach(m, known)[0] if package_of(n) not in allowed)
        if bad:
            wrong[m] = bad
    assert wrong == {}


def test_workflows_reach_no_io_library():
    known = modules()
    wrong = {}
    for m in sorted(k for k in known if k.split(".")[0] == "workflows"):
        other = reach(m, known)[1] | imports_of(known[m], known)[1]
        bad = sorted(n for n in other if n in NO_IO or n.split(".")[0] in NO_IO)
        if bad:
            wrong[m] = bad
    assert wrong == {}


def test_no_import_cycle_between_modules():
    known = modules()
    graph = {m: imports_of(p, known)[0] - {m} for m, p in known.items()}
    # a package importing its own submodules (re-exports) is not a cycle between peers
    graph = {m: {n for n in deps if not n.startswith(m + ".")} for m, deps in graph.items()}
    cycles, state = [], {}

    def visit(m, path):
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append(path[path.index(n):] + [n])
            elif n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []


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
        bad = sorted(m for m in import_names(p) if m.split(".")[0] not in WORKFLOW_IMPORTS | OURS)
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
