"""Tenants on the real dev stack, as a user meets them: ``gpuflow tenants apply FILE``, a spec
naming a tenant, ``gpuflow tenants`` showing its use; a typo in the tenant refused by
``gpuflow deploy`` (and by an update), with the deployment left as it was."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from tests.live import Live, cli, spec

FILE = {"tenants": [{"name": "prod", "priority": 100, "guarantee": {"gpus": 2}, "limit": {"gpus": 4}},
                    {"name": "poc", "priority": 10, "limit": {"gpus": 1}}]}


def tenants_cli(lv: Live, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuflow", "tenants", *args, "--data-dir", lv.stack.data_dir],
                          capture_output=True, text=True, timeout=60)


async def test_unknown_tenants_are_refused_and_use_is_shown(tmp_path):
    lv = await Live(str(tmp_path)).start({"g1": [24, 24]})
    try:
        f = tmp_path / "tenants.yaml"
        f.write_text(yaml.safe_dump(FILE))
        out = tenants_cli(lv, "apply", str(f))
        assert out.returncode == 0 and "version 1" in out.stdout, out.stderr
        typo = tmp_path / "typo.yaml"
        typo.write_text(json.dumps(spec("chat", tenant="prdo").model_dump(mode="json", exclude_none=True)))
        out = cli(lv, "deploy", str(typo))
        assert out.returncode == 2 and "tenant 'prdo' is not in the tenants file" in out.stderr, out.stderr
        assert lv.instances("chat") == []  # nothing started
        ok = tmp_path / "ok.yaml"
        ok.write_text(json.dumps(spec("chat2", tenant="poc").model_dump(mode="json", exclude_none=True)))
        out = cli(lv, "deploy", str(ok))
        assert out.returncode == 0, out.stderr
        await lv.wait(lambda: lv.states("chat2") == {"chat2-0": "running"}, 60, "chat2-0 RUNNING")
        shown = {t["tenant"]: t for t in json.loads(tenants_cli(lv, "--json").stdout)["tenants"]}
        assert shown["poc"]["gpus"] == {"used": 1, "guarantee": None, "limit": 1}  # one 10 GiB replica: 1 GPU
        assert shown["prod"]["gpus"]["used"] == 0
        moved = tmp_path / "moved.yaml"
        moved.write_text(json.dumps(spec("chat2", tenant="nope").model_dump(mode="json", exclude_none=True)))
        out = cli(lv, "deploy", str(moved))
        assert out.returncode == 2 and "tenant 'nope'" in out.stderr, out.stderr
        view = await lv.client.get_workflow_handle("deployment/chat2").query("status")
        assert view["spec"]["tenant"] == "poc" and lv.states("chat2") == {"chat2-0": "running"}
        out = tenants_cli(lv, "apply", str(tmp_path / "typo.yaml"))  # a spec is not a tenants file
        assert out.returncode == 2 and "tenants" in out.stderr, out.stderr
    finally:
        lv.close()
