"""The tenants file in the store (SQLite and PostgreSQL) and ``gpuflow tenants``: applied whole or
not at all, each tenant's use read from the ledger, and bad files refused with the problem named."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from contracts.control import InstanceRecord, PlacementPlan
from store import db, ledger, records, tenants
from scheduler.errors import InvalidInput
from scheduler.tenancy.config import TenantsFile
from scheduler.tenancy.usage import Usage
from scheduler.units import GiB
from tests.test_ledger import host

BRIEF = {"tenants": [
    {"name": "prod", "priority": 100, "guarantee": {"gpus": 8}, "limit": {"gpus": 32, "vram": "2 TiB"}},
    {"name": "dev", "priority": 30, "limit": {"gpus": 16}},
    {"name": "poc", "priority": 10, "limit": {"gpus": 4}}]}


def test_apply_load_and_versions(store):
    _, _, engine = store
    assert tenants.load(engine) == TenantsFile() and tenants.version(engine) == 0  # nothing applied: all default
    assert tenants.apply(engine, TenantsFile.model_validate(BRIEF)) == 1
    tf = tenants.load(engine)
    assert [t.name for t in tf.tenants] == ["prod", "dev", "poc"] and tf.get("prod").limit.vram == 2048 * GiB
    assert tenants.apply(engine, tf) == 2 and tenants.version(engine) == 2


@pytest.mark.parametrize("tenant, refused", [
    (None, False),       # no tenant: default, always known
    ("default", False),
    ("prod", False),
    ("prdo", True),      # a typo is caught
])
def test_a_spec_naming_an_unknown_tenant_is_refused(store, tenant, refused):
    _, _, engine = store
    tenants.apply(engine, TenantsFile.model_validate(BRIEF))
    problem = tenants.problem(engine, tenant)
    assert (problem is not None) == refused
    if refused:
        assert "prdo" in problem and "prod" in problem  # names the typo and what is known


def test_dropping_a_tenant_in_use_is_refused_and_changes_nothing(store):
    _, _, engine = store
    tenants.apply(engine, TenantsFile.model_validate(BRIEF))
    records.save_deployment(engine, "chat", {"name": "chat", "tenant": "poc"}, 1)
    with pytest.raises(InvalidInput, match=r"poc \(chat\)"):
        tenants.apply(engine, TenantsFile.model_validate({"tenants": BRIEF["tenants"][:2]}))
    assert tenants.version(engine) == 1 and tenants.load(engine).get("poc") is not None
    records.save_deployment(engine, "chat", {"name": "chat", "tenant": "poc"}, 0, "deleted")
    assert tenants.apply(engine, TenantsFile.model_validate({"tenants": BRIEF["tenants"][:2]})) == 2


def test_usage_counts_each_gpu_line_once(store):
    _, _, engine = store
    records.upsert_worker(engine, host("w1", gpus=4))
    records.save_deployment(engine, "big", {"name": "big", "tenant": "prod", "priority": 5}, 1)
    records.save_deployment(engine, "small", {"name": "small"}, 1)
    for inst, dep in (("big-0", "big"), ("small-0", "small")):
        records.create_instance(engine, InstanceRecord(name=inst, deployment=dep, model=dep, state="pending"))
    # big-0: 2 GPUs x 10 GiB; small-0: 1 GPU, 5 GiB, 1 GiB RAM
    ledger.reserve(engine, "big-0", PlacementPlan(worker="w1", gpu_indexes=[0, 1], claim={"vram": {0: 10 * GiB, 1: 10 * GiB}}))
    ledger.reserve(engine, "small-0", PlacementPlan(worker="w1", gpu_indexes=[2], claim={"vram": {2: 5 * GiB}, "ram": GiB}))
    assert tenants.usage(engine) == {"prod": Usage(gpus=2, vram=20 * GiB), "default": Usage(gpus=1, vram=5 * GiB, ram=GiB)}
    assert tenants.owners(engine)["big"] == tenants.Owner("prod", 5)
    assert tenants.owners(engine)["small"] == tenants.Owner("default", 0)


BAD = [  # (file, what the error must name)
    ({"tenants": [{"name": "a"}, {"name": "a"}]}, "repeated: a"),
    ({"tenants": [{"name": "a", "limit": {"gpus": -1}}]}, "limit.gpus"),
    ({"tenants": [{"name": "a", "guarantee": {"gpus": 8}, "limit": {"gpus": 4}}]}, "guarantee gpus 8 is above its limit 4"),
    ({"tenants": [{"name": "a", "limit": {"vram": "-2 GiB"}}]}, "limit.vram"),
    ({"tenants": [{"name": "A b"}]}, "tenants.0.name"),
    ({"tenants": [{"name": "a", "limt": {"gpus": 1}}]}, "limt"),
    ({"queueing": "LIFO"}, "queueing"),
]


def test_bad_tenants_files_are_refused_and_nothing_is_applied(tmp_path):
    d = str(tmp_path / "data")
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(BRIEF))
    run = lambda *a: subprocess.run([sys.executable, "-m", "gpuflow", "tenants", *a, "--data-dir", d],  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    assert run("apply", str(good)).returncode == 0
    for n, (doc, named) in enumerate(BAD):
        bad = tmp_path / f"bad{n}.yaml"
        bad.write_text(yaml.safe_dump(doc))
        r = run("apply", str(bad))
        assert r.returncode == 2 and named in r.stderr, (doc, r.stderr)
    shown = json.loads(run("--json").stdout)
    assert [t["tenant"] for t in shown["tenants"]] == ["prod", "dev", "poc", "default"]  # the good file stands
    assert shown["tenants"][0]["gpus"] == {"used": 0, "guarantee": 8, "limit": 32}
    assert shown["tenants"][0]["priority"] == 100


@pytest.mark.parametrize("spec, owner", [
    ({"tenant": "prod", "priority": 7}, ("prod", 7)),
    ({}, ("default", 0)),  # no tenant named: the default tenant; no priority: 0
    ({"tenant": "", "priority": 0}, ("default", 0)),
    ({"tenant": "dev", "priority": -3}, ("dev", -3)),
])
def test_view_reads_each_live_deployments_owner(store, spec, owner):
    # read with two JSON fields in SQL (both dialects), not by loading every spec
    _, _, engine = store
    records.save_deployment(engine, "chat", {"name": "chat", **spec}, 1)
    records.save_deployment(engine, "gone", {"name": "gone", "tenant": "prod"}, 0, state="deleted")
    for bind in (engine, db.reader(engine)):
        _, owners = tenants.view(bind)
        assert {k: (o.tenant, o.priority) for k, o in owners.items()} == {"chat": owner}
