"""The KV connectors a host's engines can run (issue 41: "the agent reports that capability"), from
the agent to the PD-mode filter: what the operator states (``--kv-connector``, the variable, the
inventory file) and what the agent finds (worker_agent/kv_connectors.py), refused when a name is not
one gpuflow knows; the report carrying it (bounded, signed, and an older agent's still valid); the
store's column, on both databases and on a store made before it; the snapshot; ``gpuflow hosts``."""

from __future__ import annotations

import hashlib
import os
import re
import stat
import subprocess
import sys

import pytest
from pydantic import ValidationError

from contracts.host import KV_CONNECTORS, HostReport, known_kv_connectors
from scheduler.errors import InvalidInput
from scheduler.filters import pd_mode
from scheduler.groups.spec import MODE_CONNECTOR, RoleName
from scheduler.units import GiB
from store import records
from store.snapshot import load_snapshot, worker_model
from tests.conftest import gpu
from tests.store_fixtures import sqlite_engine, store  # noqa: F401  fixtures
from tests.test_group_parity_formation import group
from views.render.cluster import hosts as render_hosts
from worker_agent.capabilities import host_engines, with_capabilities
from worker_agent.engines import EngineConfig
from worker_agent.inventory import from_file
from worker_agent.kv_connectors import MODULES, engine_pythons, found_connectors, reported, script_python


def test_the_known_names_are_the_modes_connectors_and_each_has_its_package():
    assert KV_CONNECTORS == ("mooncake", "nixl") == tuple(sorted({c for c in MODE_CONNECTOR.values() if c}))
    assert sorted(MODULES) == list(KV_CONNECTORS)


@pytest.mark.parametrize("names,out", [
    ([], []),
    (["nixl"], ["nixl"]),
    (["nixl", "mooncake", "nixl"], ["mooncake", "nixl"]),  # sorted, each once
    (["lmcache"], "--kv-connector: unknown KV connector 'lmcache' (known: mooncake, nixl)"),
    (["nixl", "NIXL"], "unknown KV connector 'NIXL'"),  # spelled as gpuflow spells it, nothing else
    (["nixl "], "unknown KV connector 'nixl '"),
])
def test_only_known_names_are_taken_from_the_operator(names, out):
    if isinstance(out, list):
        assert known_kv_connectors(names, "--kv-connector") == out
    else:
        with pytest.raises(ValueError, match=re.escape(out)):
            known_kv_connectors(names, "--kv-connector")


@pytest.mark.parametrize("stated,inventory,found,runs,out", [
    (None, None, ["nixl"], "processes", ["nixl"]),  # nothing stated: what was found
    (None, None, [], "processes", []),  # looked, found none: the filter keeps it off PD modes with a connector
    (None, None, None, "processes", None),  # could not look: not reported, the filter keeps it
    (None, ["mooncake"], ["nixl"], "processes", ["mooncake"]),  # the inventory file states it
    (["nixl"], ["mooncake"], [], "processes", ["nixl"]),  # the flag over the file over what was found
    ([], None, ["nixl"], "processes", []),  # stated none (GPUFLOW_AGENT__KV_CONNECTORS='[]')
    (None, None, ["nixl"], "nothing", None),  # gpuflow simulate's hosts start nothing: nothing found counts
    (["nixl"], None, None, "nothing", ["nixl"]),  # ... but what is stated is reported (a rehearsal of PD)
])
def test_what_the_report_says(stated, inventory, found, runs, out):
    assert reported(stated, inventory, found, runs) == out
    report = HostReport(name="h", ram_total=GiB, kv_connectors=inventory)
    assert with_capabilities(report, [], runs, None, stated, found).kv_connectors == out


def _exe(path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _python_with(tmp_path, name: str, packages: list[str]) -> str:
    """``tmp/<name>/bin/python3``: this test's Python, seeing ``packages`` (empty packages) on its path."""
    site = tmp_path / name / "site"
    for p in packages:
        (site / p).mkdir(parents=True)
        # found, never imported: an import here would end the probe, and nothing would be found
        (site / p / "__init__.py").write_text("raise SystemExit('imported')\n")
    return _exe(tmp_path / name / "bin" / "python3",
                f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')


@pytest.mark.parametrize("head,out", [
    ("#!{py}\nimport vllm\n", "{py}"),  # pip's console script
    ("#!{py} -E\n", "{py}"),
    ("#!/usr/bin/env python3\n", "python3"),
    ("#!/usr/bin/env python3.11\n", "python3.11"),
    # pip's form for a path a #! line cannot hold (too long, or with a space)
    ("#!/bin/sh\n'''exec' \"{spaced}\" \"$0\" \"$@\"\n' '''\n", "{spaced}"),
    ("#!/bin/sh\n'''exec' {py} \"$0\" \"$@\"\n' '''\n", "{py}"),
    ("#!/opt/my env/bin/python3\n", None),  # not a path a #! line holds: not guessed
    ("#!/bin/sh\nexec vllm-real \"$@\"\n", None),  # a shell wrapper: which Python is not known
    ("#!/usr/bin/env bash\n", None),
    ("\x7fELF\x02\x01", None),  # a binary
    ("", None),
])
def test_the_python_behind_the_vllm_executable(tmp_path, head, out):
    paths = {"py": "/opt/vllm/bin/python3", "spaced": "/opt/my env/bin/python3"}
    vllm = _exe(tmp_path / "vllm", head.format(**paths))
    assert script_python(vllm) == (out.format(**paths) if out else None)
    assert script_python(str(tmp_path / "gone")) is None


@pytest.mark.parametrize("vllm_has,sglang_has,runnable,out", [
    (["nixl"], None, ["vllm"], ["nixl"]),
    (["nixl", "mooncake"], None, ["vllm", "custom"], ["mooncake", "nixl"]),
    ([], None, ["vllm"], []),  # vLLM here, with neither package: none
    (["nixl"], ["mooncake"], ["vllm", "sglang"], []),  # every PD engine must find it: nixl lacks SGLang's
    (["nixl", "mooncake"], ["nixl"], ["vllm", "sglang"], ["nixl"]),
    (None, ["mooncake"], ["sglang"], ["mooncake"]),
    ("binary", None, ["vllm"], None),  # a vllm that is not a Python script: not known
    ("binary", ["nixl"], ["vllm", "sglang"], None),  # one PD engine not known: not known
    (None, None, ["llama.cpp", "custom"], None),  # no PD engine to ask
])
def test_the_connectors_found_in_the_engines_interpreters(tmp_path, vllm_has, sglang_has, runnable, out):
    vllm = str(tmp_path / "no-vllm")
    if vllm_has == "binary":
        vllm = _exe(tmp_path / "vllm", "\x7fELF")
    elif vllm_has is not None:
        vllm = _exe(tmp_path / "vllm", f"#!{_python_with(tmp_path, 'v', vllm_has)}\n")
    sglang = _python_with(tmp_path, "s", sglang_has) if sglang_has is not None else "python3"
    cfg = EngineConfig(vllm=vllm, sglang_python=sglang)
    assert found_connectors(cfg, runnable) == out
    pythons = engine_pythons(cfg, runnable)
    assert (pythons is None) == (out is None)


def test_the_agent_finds_them_only_where_launches_start_processes(tmp_path):
    vllm = _exe(tmp_path / "vllm", f"#!{_python_with(tmp_path, 'v', ['nixl'])}\n")
    cfg = EngineConfig(vllm=vllm, sglang_python=str(tmp_path / "no-python"))
    assert host_engines(cfg, "processes") == (["vllm"], ["nixl"])
    assert host_engines(cfg, "nothing") == (["vllm"], None)  # gpuflow simulate's: not looked for


@pytest.mark.parametrize("text,out", [
    ("ram_total: 1 GiB\n", None),
    ("ram_total: 1 GiB\nkv_connectors: [nixl, mooncake]\n", ["mooncake", "nixl"]),
    ("ram_total: 1 GiB\nkv_connectors: []\n", []),
    ("ram_total: 1 GiB\nkv_connectors: [nixl, lmcache]\n", "unknown KV connector 'lmcache' (known: mooncake, nixl)"),
    ("ram_total: 1 GiB\nkv_connectors: nixl\n", "kv_connectors"),  # a list, not a word
])
def test_the_inventory_file_states_them(tmp_path, text, out):
    (tmp_path / "inv.yaml").write_text(text)
    if out is None or isinstance(out, list):
        assert from_file("h", str(tmp_path / "inv.yaml")).kv_connectors == out
    else:
        with pytest.raises(InvalidInput, match=re.escape(out)):
            from_file("h", str(tmp_path / "inv.yaml"))


@pytest.mark.parametrize("argv,env,why", [
    (["--kv-connector", "nixl", "--kv-connector", "lmcache"], {},
     "gpuflow: error: --kv-connector: unknown KV connector 'lmcache' (known: mooncake, nixl)"),
    ([], {"GPUFLOW_AGENT__KV_CONNECTORS": '["rdma"]'},
     "GPUFLOW_AGENT__KV_CONNECTORS: unknown KV connector 'rdma' (known: mooncake, nixl) (got ['rdma'])"),
])
def test_gpuflow_agent_refuses_a_name_it_does_not_know_before_it_connects(tmp_path, argv, env, why):
    # nothing listens on 127.0.0.1:1: the refusal comes first, exit 2 at once, not after a wait for Temporal
    p = subprocess.run([sys.executable, "-m", "gpuflow", "agent", "--name", "h", "--address", "127.0.0.1:1",
                        "--data-dir", str(tmp_path), *argv], env={**os.environ, **env}, capture_output=True,
                       text=True, timeout=60)
    assert (p.returncode, p.stderr.strip().splitlines()[-1].strip()) == (2, why), p.stderr


def test_the_flag_and_the_variable_set_the_agents_setting(monkeypatch):
    from gpuflow.cli import parser
    from gpuflow.cli.connection import settings_from

    a = parser().parse_args(["agent", "--kv-connector", "nixl", "--kv-connector", "mooncake"])
    assert settings_from(a).agent.kv_connectors == ["mooncake", "nixl"]
    monkeypatch.setenv("GPUFLOW_AGENT__KV_CONNECTORS", '["nixl"]')
    assert settings_from(parser().parse_args(["agent"])).agent.kv_connectors == ["nixl"]
    monkeypatch.delenv("GPUFLOW_AGENT__KV_CONNECTORS")
    assert settings_from(parser().parse_args(["agent"])).agent.kv_connectors is None  # default: found


@pytest.mark.parametrize("value,ok", [
    (None, True),
    (["nixl", "mooncake"], True),
    (["lmcache"], True),  # a newer agent's connector: bounded, not refused (the filter asks only for its mode's)
    (["x" * 33], False),  # each name at most 32 characters
    (["NIXL"], False), (["nixl;rm"], False), ([""], False),
    ([f"c{i}" for i in range(17)], False),  # at most 16
])
def test_the_report_field_is_bounded(value, ok):
    if ok:
        assert HostReport(name="h", ram_total=GiB, kv_connectors=value).kv_connectors == value
    else:
        with pytest.raises(ValidationError, match="kv_connectors"):
            HostReport(name="h", ram_total=GiB, kv_connectors=value)


def test_an_older_agents_report_validates_and_keeps_its_fingerprint():
    old = {"name": "h", "ram_total": GiB, "runs": "processes"}  # no kv_connectors: an agent before the field
    r = HostReport.model_validate(old)
    assert r.kv_connectors is None
    before = r.model_dump_json(exclude={"agent_version", "boot", "usage", "ended", "auth", "kv_connectors",
                                        "foreign_degraded"})
    assert r.fingerprint() == hashlib.sha256(before.encode()).hexdigest()[:16]  # as before the field
    assert r.model_copy(update={"kv_connectors": ["nixl"]}).fingerprint() != r.fingerprint()  # an inventory change
    assert r.model_copy(update={"kv_connectors": []}).fingerprint() != r.fingerprint()


def _report(name: str, kv: list[str] | None) -> HostReport:
    return HostReport(name=name, ram_total=64 * GiB, gpus=[gpu(0, 24)], simulated=True, runs="processes",
                      kv_connectors=kv)


def test_the_store_keeps_them_and_the_snapshot_and_the_pd_filter_read_them(store):  # noqa: F811
    """SQLite and PostgreSQL: a report's kv_connectors is the row's, then the snapshot worker's, then
    what the PD-mode filter judges a vllm-nixl decode member by."""
    _, _, engine = store
    for name, kv in (("nixl-host", ["nixl"]), ("mc-host", ["mooncake"]), ("none-host", []), ("old-host", None)):
        assert records.upsert_worker(engine, _report(name, kv)) is True
    rows = {w.name: w.kv_connectors for w in records.workers(engine)}
    assert rows == {"nixl-host": ["nixl"], "mc-host": ["mooncake"], "none-host": [], "old-host": None}
    snap = load_snapshot(engine)
    assert {w.name: w.kv_connectors for w in snap.workers} == rows
    kept, v = pd_mode.Filter(group(backend="vllm", mode="vllm-nixl"), RoleName.DECODE).run(None, snap.workers)
    assert [w.name for w in kept] == ["nixl-host", "old-host"]  # old-host reports nothing: kept
    assert v.removed == {
        "mc-host": ["its engines cannot run the nixl KV connector pd mode vllm-nixl needs (it reports: mooncake)"],
        "none-host": ["its engines cannot run the nixl KV connector pd mode vllm-nixl needs (it reports: none)"]}
    # an agent restarted with --kv-connector mooncake: an inventory change (the row's generation moves)
    assert records.upsert_worker(engine, _report("nixl-host", ["mooncake", "nixl"])) is True
    assert records.upsert_worker(engine, _report("nixl-host", ["mooncake", "nixl"])) is False
    row = next(w for w in records.workers(engine) if w.name == "nixl-host")
    assert worker_model(row).kv_connectors == ["mooncake", "nixl"]


def test_a_store_made_before_the_column_gains_it(sqlite_engine):  # noqa: F811
    from sqlalchemy import text

    from store import db

    records.upsert_worker(sqlite_engine, _report("old", None))
    with sqlite_engine.begin() as c:
        c.execute(text("ALTER TABLE gpuflow_workers DROP COLUMN kv_connectors"))
    db.init_db(sqlite_engine)  # adds the nullable column; the old row reads as not reported
    assert [w.kv_connectors for w in load_snapshot(sqlite_engine).workers] == [None]
    records.upsert_worker(sqlite_engine, _report("old", ["nixl"]))
    assert [w.kv_connectors for w in load_snapshot(sqlite_engine).workers] == [["nixl"]]


@pytest.mark.parametrize("kv,line", [
    (["mooncake", "nixl"], "KV connectors: mooncake, nixl"),
    ([], "KV connectors: none"),
    (None, None),  # not reported: no line
])
def test_gpuflow_hosts_shows_them(kv, line):
    h = {"name": "h", "state": "ready", "report": _report("h", kv).model_dump(mode="json")}
    lines = [ln.strip() for ln in render_hosts([h]).splitlines()]
    assert [ln for ln in lines if ln.startswith("KV connectors")] == ([line] if line else [])

