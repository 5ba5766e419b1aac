"""The documentation site (issue 36): `mkdocs build --strict` passes, and its generated reference
holds every CLI command and flag, every field of the spec, the tenants file and the cluster
snapshot, every setting, every metric and every route, checked here against the parsers, models
and registries themselves (not against the generator's own lists). The README stays short and
shows the two commands in its first screen. A page whose link or image is broken fails the strict
build (shown on a small site with the same mkdocs.yml settings)."""

from __future__ import annotations

import argparse
import html
import inspect
import os
import pathlib
import re
import subprocess
import sys

import pytest
import yaml
from pydantic import BaseModel

ROOT = pathlib.Path(__file__).resolve().parent.parent
MKDOCS = [sys.executable, "-m", "mkdocs"]
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about its successor: not a warning


def build(config: pathlib.Path, out: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([*MKDOCS, "build", "--strict", "-f", str(config), "-d", str(out)], cwd=config.parent,
                          env=ENV, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("site")
    r = build(ROOT / "mkdocs.yml", out)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "WARNING" not in r.stderr, r.stderr
    return out


def text_of(site: pathlib.Path, page: str) -> str:
    """A built page's text, tags dropped and entities read, one space between words."""
    raw = (site / page / "index.html").read_text()
    body = re.sub(r"<[^>]+>", " ", raw.split('<div class="md-content"', 1)[-1])
    return " ".join(html.unescape(body).split())


def codes_of(site: pathlib.Path, page: str) -> set[str]:
    raw = (site / page / "index.html").read_text()
    return {html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<code>(.*?)</code>", raw, re.S)}


# --- the CLI -------------------------------------------------------------------------------------

def cli_commands():
    from gpuflow.cli import parser

    out = []

    def walk(p, path):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    out.append(((*path, name), sub))
                    walk(sub, (*path, name))
    walk(parser(), ())
    return out


def test_every_command_and_flag_is_in_the_cli_reference(site):
    text = text_of(site, "reference/cli")
    cmds = cli_commands()
    assert len(cmds) > 20  # schedule, estimate, ..., keys create, tenants apply
    missing = []
    for path, p in cmds:
        if "gpuflow " + " ".join(path) not in text:
            missing.append("gpuflow " + " ".join(path))
        for a in p._actions:
            for flag in a.option_strings:
                if flag not in ("-h", "--help") and flag not in text:
                    missing.append(f"gpuflow {' '.join(path)} {flag}")
    assert not missing, missing


# --- the files' fields ---------------------------------------------------------------------------

def models_in(tp) -> list[type[BaseModel]]:
    import typing

    if inspect.isclass(tp) and issubclass(tp, BaseModel):
        return [tp]
    return [m for a in typing.get_args(tp) for m in models_in(a)]


def all_fields(model: type[BaseModel]) -> set[tuple[str, str]]:
    """(class name, field name) of the model and every model nested in it."""
    seen, todo, out = set(), [model], set()
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        for name, f in m.model_fields.items():
            out.add((m.__name__, name))
            todo += models_in(f.annotation)
    return out


def file_models():
    from scheduler.cluster import ClusterSnapshot
    from scheduler.spec import ModelSpec
    from scheduler.tenancy.config import TenantsFile

    return [ModelSpec, TenantsFile, ClusterSnapshot]


@pytest.mark.parametrize("model", file_models(), ids=lambda m: m.__name__)
def test_every_field_is_in_the_spec_reference(site, model):
    codes = codes_of(site, "reference/spec")
    missing = [f"{c}.{n}" for c, n in sorted(all_fields(model))
               if not any(code == n or code.endswith("." + n) for code in codes)]
    assert not missing, missing


def test_notes_name_only_fields_and_routes_that_exist():
    """docs/refgen/notes.yaml keeps no note for a field (or route) the code no longer has."""
    from gateway.config import GatewaySettings
    from gpuflow.settings import Settings

    known = {f"{c}.{n}" for m in [*file_models(), Settings] for c, n in all_fields(m)}
    known |= {f"GatewaySettings.{n}" for n in GatewaySettings.__dataclass_fields__}
    import sqlalchemy
    from gateway.app import build as build_app

    known |= {f"route {r.path}" for r in build_app(sqlalchemy.create_engine("sqlite://")).routes}
    notes = yaml.safe_load((ROOT / "docs" / "refgen" / "notes.yaml").read_text())
    assert set(notes) - known == set()


# --- settings, metrics, routes -------------------------------------------------------------------

def env_names(model: type[BaseModel], prefix: str = "GPUFLOW_") -> list[str]:
    out = []
    for name, f in model.model_fields.items():
        sub = models_in(f.annotation)
        out += env_names(sub[0], f"{prefix}{name.upper()}__") if sub else [f"{prefix}{name.upper()}"]
    return out


def test_every_setting_is_in_the_settings_reference(site):
    from gateway.config import GatewaySettings
    from gpuflow.settings import Settings

    codes = codes_of(site, "reference/settings")
    names = env_names(Settings)
    assert "GPUFLOW_TIMINGS__UNREACHABLE_GRACE_S" in names and "GPUFLOW_DATA_DIR" in names
    missing = [n for n in names + list(GatewaySettings.__dataclass_fields__) if n not in codes]
    assert not missing, missing


def test_every_metric_is_in_the_metrics_reference(site):
    from prometheus_client import generate_latest

    from docs.refgen.metrics import registries

    text = text_of(site, "reference/metrics")
    with registries() as regs:
        exposed = {line.split()[2] for r in regs.values() for line in generate_latest(r).decode().splitlines()
                   if line.startswith("# TYPE") and not line.split()[2].endswith("_created")}
    # (<name>_created: prometheus-client's timestamp beside each counter and histogram, said once on the page)
    assert len(exposed) > 40
    missing = [n for n in sorted(exposed) if n not in text]
    assert not missing, missing


def test_every_route_is_in_the_http_reference(site):
    import sqlalchemy

    import console
    from gateway.app import build as build_app

    codes = codes_of(site, "reference/http-api")
    paths = [r.path for r in build_app(sqlalchemy.create_engine("sqlite://")).routes]
    paths += [console.PREFIX + p for page in console.PAGES for p, _, _ in page.ROUTES]
    assert "/v1/chat/completions" in paths
    assert [p for p in paths if p not in codes] == []


def test_every_workflow_message_is_in_the_temporal_reference(site):
    from temporalio import workflow

    from gpuflow.server import WORKFLOWS

    codes = codes_of(site, "reference/temporal")
    missing = []
    for cls in WORKFLOWS:
        d = workflow._Definition.must_from_class(cls)  # noqa: SLF001
        if d.name not in codes:
            missing.append(d.name)
        missing += [f"{d.name}.{n}" for n in (*d.signals, *d.updates, *d.queries) if n and n not in codes]
    assert not missing, missing


# --- no page needs the network -------------------------------------------------------------------

def test_no_page_loads_anything_from_elsewhere(site):
    """Every script, stylesheet, font and image a page names is the site's own."""
    found = []
    for page in site.rglob("*.html"):
        raw = page.read_text()
        found += [(page.name, m) for m in re.findall(r'<(?:script|img|link|iframe)[^>]+(?:src|href)="(https?:)?//', raw)]
    for css in site.rglob("*.css"):
        found += [(css.name, m) for m in re.findall(r"@import\s+url\(['\"]?https?://|url\(['\"]?https?://", css.read_text())]
    assert not found, found


# --- the README ----------------------------------------------------------------------------------

FIRST_SCREEN = 40  # lines a newcomer sees before scrolling


def test_readme_is_short_and_starts_with_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, len(lines)
    first = "\n".join(lines[:FIRST_SCREEN])
    assert "make demo" in first and "make test" in first


def test_readme_links_go_to_pages_that_exist():
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#]+\.(?:md|png))(?:#[^)]*)?\)", text)
    assert any(link.startswith("docs/") for link in links)
    assert [link for link in links if not link.startswith("http") and not (ROOT / link).exists()] == []


# --- a broken link or image fails the build ------------------------------------------------------

def test_a_broken_link_or_image_fails_the_strict_build(tmp_path):
    """The same validation settings as mkdocs.yml, on a two-page site: each breakage alone fails."""
    ours = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## Here\n")
    config = {"site_name": "t", "docs_dir": "docs", "strict": True, "validation": ours["validation"],
              "markdown_extensions": ["toc"], "nav": ["index.md", "other.md"]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    cases = {
        "fine": ("[a page](other.md#here)", None),
        "page": ("[a page](nowhere.md)", "nowhere.md"),
        "anchor": ("[a page](other.md#nothing)", "#nothing"),
        "image": ("![a picture](images/none.png)", "images/none.png"),
    }
    for case, (body, named) in cases.items():
        (tmp_path / "docs" / "index.md").write_text(f"# Home\n\n{body}\n")
        r = build(tmp_path / "mkdocs.yml", tmp_path / "out")
        if named is None:
            assert r.returncode == 0, (case, r.stderr)
        else:
            assert r.returncode != 0 and named in r.stderr, (case, r.stderr)
