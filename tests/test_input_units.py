"""Inputs read as something they are not: byte sizes written in bits, YAML mappings that name a
key twice, tenants files too long to read in reasonable time (issue 24, "Every input bounded")."""

from __future__ import annotations

import glob
import json
import os
import time

import pytest
import yaml
from pydantic import ValidationError

from gpuflow import files
from scheduler.errors import InvalidInput
from scheduler.fields import parse_bytes
from scheduler.tenancy.config import MAX_TENANTS, TenantsFile
from tests.test_cli import CLUSTER, EXAMPLES, gpuflow

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MODEL = os.path.join(EXAMPLES, "model-custom.yaml")


# --- byte sizes -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, want", [
    ("1073741824", 1073741824),
    ("4 GB", 4_000_000_000),          # 4 x 10^9
    ("4GB", 4_000_000_000),
    ("4 gB", 4_000_000_000),          # the prefix in any case; B (uppercase) is bytes
    ("4 G", 4_000_000_000),           # a bare prefix is bytes, as it always was read
    ("4 g", 4_000_000_000),
    ("4G", 4_000_000_000),
    ("4 GiB", 4 * 2**30),             # 4 x 1,073,741,824 = 4,294,967,296
    ("4 GIB", 4 * 2**30),
    ("4 giB", 4 * 2**30),
    ("512MiB", 512 * 2**20),          # 536,870,912
    ("512 MB", 512_000_000),
    ("3 kB", 3_000),                  # SI's lowercase k
    ("3 KB", 3_000),
    ("3 k", 3_000),
    ("3 KiB", 3 * 1024),              # 3,072
    ("2 TiB", 2 * 2**40),             # 2,199,023,255,552
    ("2 TB", 2 * 10**12),
    ("1.5 GiB", 3 * 2**29),           # 1.5 x 2^30 = 1,610,612,736
    ("7 B", 7),
    ("7", 7),
])
def test_byte_sizes_in_bytes(text, want):
    assert parse_bytes(text) == want


@pytest.mark.parametrize("text, message", [
    # a lowercase b is bits: 4 Gb = 4 x 10^9 bits = 500,000,000 bytes, never 4,000,000,000
    ("4 Gb", "'4 Gb' is gigabits; write '4 GB' or '4 GiB'"),
    ("4Gb", "'4Gb' is gigabits; write '4 GB' or '4 GiB'"),
    ("4 gb", "'4 gb' is gigabits; write '4 GB' or '4 GiB'"),
    ("100 Mb", "'100 Mb' is megabits; write '100 MB' or '100 MiB'"),
    ("100 mb", "'100 mb' is megabits; write '100 MB' or '100 MiB'"),
    ("64 kb", "'64 kb' is kilobits; write '64 kB' or '64 KiB'"),
    ("64 Kb", "'64 Kb' is kilobits; write '64 kB' or '64 KiB'"),
    ("2 Tb", "'2 Tb' is terabits; write '2 TB' or '2 TiB'"),
    ("4 gib", "'4 gib' is gibibits; write '4 GiB'"),
    ("4 Gib", "'4 Gib' is gibibits; write '4 GiB'"),
    ("4 GIb", "'4 GIb' is gibibits; write '4 GiB'"),
    ("8 mib", "'8 mib' is mebibits; write '8 MiB'"),
    ("8 kib", "'8 kib' is kibibits; write '8 KiB'"),
    ("1 tib", "'1 tib' is tebibits; write '1 TiB'"),
    ("1.5 Gb", "'1.5 Gb' is gigabits; write '1.5 GB' or '1.5 GiB'"),
    ("512 b", "'512 b' is bits; write '512 B' for bytes"),
    ("512b", "'512b' is bits; write '512 B' for bytes"),
    ("-4 Gb", "is negative"),
    ("-4 GB", "is negative"),
    ("4 Gi", "is not a byte size"),   # a binary prefix needs its B, as before
    ("4 xB", "is not a byte size"),
    ("4 bytes", "is not a byte size"),
])
def test_sizes_written_in_bits_are_refused_saying_what_to_write(text, message):
    with pytest.raises(ValueError) as e:
        parse_bytes(text)
    assert message in str(e.value), str(e.value)


def test_a_spec_in_gigabits_exits_2_with_the_fix(tmp_path):
    spec = tmp_path / "m.yaml"
    spec.write_text("name: m\nsource: {local_path: /models/m}\nbackend: custom\nrun_command: srv --port {port}\n"
                    "resources: {vram: 4 Gb, ram: 1 GiB}\n")
    p = gpuflow("schedule", "--cluster", CLUSTER, "--model", str(spec), check=2)
    assert "resources.vram" in p.stderr and "'4 Gb' is gigabits; write '4 GB' or '4 GiB'" in p.stderr, p.stderr


def _strings(v):
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _strings(k)
            yield from _strings(x)
    elif isinstance(v, list):
        for x in v:
            yield from _strings(x)
    elif isinstance(v, str):
        yield v


def test_no_bundled_file_writes_a_size_in_bits():
    """Every YAML and JSON file shipped or used by the tests and benches, and every YAML block in
    the docs: no value reads as a size in bits (which the parser now refuses)."""
    import re

    bits = re.compile(r"^\s*\d+(?:\.\d+)?\s*(?:[kKmMgGtT][iI]?)?b\s*$")
    found = []
    paths = [p for d in ("gpuflow", "docs", "tests", "bench", "deploy") for ext in ("yaml", "yml", "json")
             for p in glob.glob(os.path.join(ROOT, d, "**", f"*.{ext}"), recursive=True)]
    assert paths
    for p in paths:
        with open(p) as f:
            text = f.read()
        try:
            docs = [json.loads(text)] if p.endswith(".json") else list(yaml.safe_load_all(text))
        except Exception:  # noqa: BLE001  templates and the like: the text is searched below
            docs = []
        found += [(p, s) for d in docs for s in _strings(d) if bits.match(s)]
        found += [(p, m) for m in re.findall(r"\b\d+(?:\.\d+)?\s?(?:[kKmMgGtT][iI]?)b\b", text)
                  if not re.match(r"\d+b$", m)]  # "8b" in a model's name (llama3-8b) is not a size
    for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True) + [os.path.join(ROOT, "README.md")]:
        with open(p) as f:
            for block in re.findall(r"```ya?ml\n(.*?)```", f.read(), re.S):
                found += [(p, m) for m in re.findall(r"\b\d+(?:\.\d+)?\s?(?:[kKmMgGtT][iI]?)b\b", block)
                          if not re.match(r"\d+b$", m)]
    assert not found, found


# --- duplicate YAML keys ----------------------------------------------------------------------

@pytest.mark.parametrize("text, key, line, first", [
    ("a: 1\nb: 2\na: 3\n", "a", 3, 1),
    ("{a: 1, a: 2}\n", "a", 1, 1),
    ("x:\n  y: 1\n  z: 2\n  y: 3\n", "y", 4, 2),
    ("l:\n- {n: 1, n: 2}\n", "n", 2, 2),
    ("1: a\n0x1: b\n", 1, 2, 1),  # the same key, spelled two ways
    ("base: &b {a: 1}\nd:\n  <<: *b\n  a: 5\n  a: 6\n", "a", 5, 4),
])
def test_a_mapping_naming_a_key_twice_is_refused_with_the_key_and_lines(text, key, line, first):
    with pytest.raises(files.DuplicateKey) as e:
        files.load_yaml(text)
    assert (e.value.key, e.value.line, e.value.first) == (key, line, first)
    assert f"line {line}: duplicate key {key!r} (first at line {first})" in str(e.value)


@pytest.mark.parametrize("text, want", [
    ("base: &b {a: 1, c: 2}\nd:\n  <<: *b\n  a: 5\n", {"base": {"a": 1, "c": 2}, "d": {"a": 5, "c": 2}}),
    ("b: &b {a: 1}\no: &o {a: 2}\nd:\n  <<: [*b, *o]\n  z: 1\n", {"b": {"a": 1}, "o": {"a": 2}, "d": {"a": 1, "z": 1}}),
    ("1: a\n'1': b\n", {1: "a", "1": "b"}),  # an int and a string: two keys
    ("a: {x: 1}\nb: {x: 1}\n", {"a": {"x": 1}, "b": {"x": 1}}),
])
def test_merges_and_distinct_keys_load_as_before(text, want):
    assert files.load_yaml(text) == want == yaml.load(text, Loader=yaml.SafeLoader)


def test_a_spec_with_a_duplicate_key_exits_2_naming_it(tmp_path):
    spec = tmp_path / "m.yaml"
    spec.write_text("name: m\nsource: {local_path: /models/m}\nbackend: custom\nrun_command: srv --port {port}\n"
                    "resources: {vram: 4 GiB, ram: 1 GiB}\nreplicas: 1\nreplicas: 8\n")
    p = gpuflow("schedule", "--cluster", CLUSTER, "--model", str(spec), check=2)
    assert f"{spec}: not valid YAML: line 7: duplicate key 'replicas' (first at line 6)" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_a_cluster_file_with_a_duplicate_key_exits_2_naming_it(tmp_path):
    with open(CLUSTER) as f:
        lines = f.read().splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.strip().startswith("ram_total:"))
    lines.insert(at + 1, lines[at])  # the same worker's ram_total twice
    bad = tmp_path / "cluster.yaml"
    bad.write_text("\n".join(lines) + "\n")
    p = gpuflow("schedule", "--cluster", str(bad), "--model", MODEL, check=2)
    assert f"line {at + 2}: duplicate key 'ram_total' (first at line {at + 1})" in p.stderr, p.stderr


@pytest.mark.parametrize("kind", ["tenants", "inventory-like"])
def test_other_gpuflow_files_refuse_duplicates_too(tmp_path, kind):
    f = tmp_path / "f.yaml"
    if kind == "tenants":
        f.write_text("tenants:\n  - name: a\n    priority: 1\n    priority: 100\n")
        with pytest.raises(InvalidInput, match=r"line 4: duplicate key 'priority' \(first at line 3\)"):
            files.load(str(f), TenantsFile)
    else:
        f.write_text("ram_total: 64 GiB\ngpus: []\nram_total: 1 TiB\n")
        with pytest.raises(InvalidInput, match=r"line 3: duplicate key 'ram_total'"):
            files.read_document(str(f))


def test_every_bundled_yaml_file_still_loads():
    """No shipped example, doc-referenced or test fixture file names a key twice."""
    paths = [p for d in ("gpuflow", "tests", "bench", "deploy")
             for ext in ("yaml", "yml") for p in glob.glob(os.path.join(ROOT, d, "**", f"*.{ext}"), recursive=True)]
    assert paths
    bad = []
    for p in paths:
        with open(p) as f:
            text = f.read()
        try:
            list(yaml.safe_load_all(text))
        except yaml.YAMLError:
            continue  # a template, not YAML as it stands
        try:
            list(yaml.load_all(text, Loader=files.YamlLoader))
        except files.DuplicateKey as e:
            bad.append((p, str(e)))
    assert not bad, bad


# --- the tenants file ---------------------------------------------------------------------------

def _tenants(n: int) -> list[dict]:
    return [{"name": f"t{i}", "priority": i % 100, "guarantee": {"gpus": 1}, "limit": {"gpus": 4, "vram": "80 GiB"}}
            for i in range(n)]


def test_the_tenants_file_is_bounded_and_the_limit_named(tmp_path):
    many = tmp_path / "many.yaml"
    many.write_text("tenants:\n" + "".join(  # 100,000 tenants, 9 MB (written as text: yaml.safe_dump took 40 s)
        f"- {{name: t{i}, priority: {i % 100}, guarantee: {{gpus: 1}}, limit: {{gpus: 4, vram: 80 GiB}}}}\n"
        for i in range(MAX_TENANTS * 10)))
    started = time.monotonic()
    with pytest.raises(InvalidInput) as e:
        files.load(str(many), TenantsFile)
    took = time.monotonic() - started
    assert "tenants: more than 10,000 items; at most 10,000 are allowed" in str(e.value)
    assert took < 10, took  # counted on the parser's events, not built whole first (about 30 s)
    j = tmp_path / "many.json"
    j.write_text(json.dumps({"tenants": _tenants(MAX_TENANTS + 1)}))
    with pytest.raises(InvalidInput, match="10,001 tenants; a tenants file may list at most 10,000"):
        files.load(str(j), TenantsFile)
    with pytest.raises(ValidationError, match="at most 10,000"):  # also where the store's copy is read
        TenantsFile.model_validate({"tenants": _tenants(MAX_TENANTS + 1)})


def test_ten_thousand_tenants_validate_in_linear_time():
    """The uniqueness check counted each name in the whole list (10,000 tenants: 6 s; 100,000:
    past a minute), and ``get`` walked the list on every call."""
    raw = {"tenants": _tenants(MAX_TENANTS)}
    TenantsFile.model_validate({"tenants": _tenants(100)})  # warm
    started = time.monotonic()
    tf = TenantsFile.model_validate(raw)
    for i in range(0, MAX_TENANTS, 7):
        assert tf.get(f"t{i}").name == f"t{i}"
    took = time.monotonic() - started
    assert took < 5, took  # quadratic, it took 6 s here
    assert tf.get("default").name == "default" and tf.get(None).name == "default" and tf.get("nope") is None
    dup = {"tenants": _tenants(30) + _tenants(30)}
    with pytest.raises(ValidationError, match=r"repeated: t0, t1, t10, .* and 10 more"):
        TenantsFile.model_validate(dup)


def test_a_tenants_file_of_the_limit_applies_in_seconds(tmp_path):
    """``gpuflow tenants apply`` of 10,000 tenants, through the CLI, into a SQLite store."""
    f = tmp_path / "t.yaml"
    f.write_text(yaml.safe_dump({"tenants": _tenants(MAX_TENANTS)}))
    started = time.monotonic()
    p = gpuflow("tenants", "apply", str(f), "--data-dir", str(tmp_path / "d"))
    assert "tenants file applied (version 1)" in p.stdout, p.stdout + p.stderr
    assert time.monotonic() - started < 45
    over = tmp_path / "over.yaml"
    over.write_text(yaml.safe_dump({"tenants": _tenants(MAX_TENANTS + 1)}))
    p = gpuflow("tenants", "apply", str(over), "--data-dir", str(tmp_path / "d"), check=2)
    assert "at most 10,000" in p.stderr, p.stderr
