"""One reason, everywhere (issue 25): a PENDING replica's reason is what the PENDING queue last
judged, kept current in the store at every wake, and `gpuflow status`, `explain` and `queue` show
that same text. The probe's case: GPUs freed, and the queue said "quota" while status and explain
still said "unschedulable ... largest allocatable GPU has 4.0 GiB"."""

from __future__ import annotations

import json
import subprocess
import sys

from store import tenants
from gpuflow import ops
from scheduler.tenancy.config import TenantsFile
from tests.live import FAST, Live, cli, spec


async def test_queue_status_and_explain_agree_after_capacity_changes(tmp_path):
    lv = await Live(str(tmp_path)).start({"h1": [24, 24]})
    store = ["--data-dir", lv.stack.data_dir]
    try:
        tenants.apply(lv.engine, TenantsFile.model_validate({"tenants": [{"name": "dev", "limit": {"gpus": 1}}]}))
        await ops.deploy(lv.client, spec("big", vram_gib=20, replicas=2), FAST)
        await lv.wait(lambda: lv.states("big") == {"big-0": "running", "big-1": "running"}, 60, "big RUNNING")
        await ops.deploy(lv.client, spec("d", vram_gib=20, replicas=2, tenant="dev"), FAST)
        # 24 - 20 = 4 GiB left on each GPU: neither d replica fits anywhere
        await lv.wait(lambda: {i.state for i in lv.instances("d")} == {"pending"}
                      and all("4.0 GiB" in i.reason for i in lv.instances("d")), 60, "d PENDING, not fitting")
        out = cli(lv, "delete", "big", "--wait")
        assert out.returncode == 0, out.stderr
        # both GPUs free: one d replica runs, the other waits on dev's limit of 1 GPU
        await lv.wait(lambda: sorted(i.state for i in lv.instances("d")) == ["pending", "running"], 60,
                      "one d RUNNING, one PENDING")
        waiting = next(i.name for i in lv.instances("d") if i.state == "pending")
        await lv.wait(lambda: "quota" in next(i.reason for i in lv.instances("d") if i.name == waiting), 30,
                      "the waiting replica's reason says the quota")
        stored = next(i.reason for i in lv.instances("d") if i.name == waiting)
        assert "dev" in stored and "4.0 GiB" not in stored, stored

        status = json.loads(cli(lv, "status", "d", "--json", *store).stdout)
        shown = {i["name"]: i["reason"] for d in status["deployments"] for i in d["instances"]}
        q = subprocess.run([sys.executable, "-m", "gpuflow", "queue", "--json", *store],  # the store only
                           capture_output=True, text=True, timeout=60)
        queue = json.loads(q.stdout)["queue"]
        queued = {q["instance"]: q["reason"] for q in queue}
        explained = cli(lv, "explain", waiting, *store).stdout
        assert shown[waiting] == queued[waiting] == stored, (shown, queued, stored)
        assert f"waiting now: {stored}" in explained, explained
        assert "4.0 GiB" not in cli(lv, "status", "d", *store).stdout.split(waiting, 1)[1].splitlines()[0]

        # a new tenants file: the reason follows at once (no capacity changed, no sweep yet)
        (tmp_path / "tenants.yaml").write_text("tenants:\n  - {name: dev, limit: {vram: 30 GiB}}\n")
        t = subprocess.run([sys.executable, "-m", "gpuflow", "tenants", "apply", str(tmp_path / "tenants.yaml"), *store],
                           capture_output=True, text=True, timeout=60)
        assert t.returncode == 0 and "1 waiting replica(s) given the new reason" in t.stdout, (t.stdout, t.stderr)
        now = next(i.reason for i in lv.instances("d") if i.name == waiting)
        assert now != stored and "quota" in now and "VRAM" in now.upper(), now
        status = json.loads(cli(lv, "status", "d", "--json", *store).stdout)
        assert {i["name"]: i["reason"] for d in status["deployments"] for i in d["instances"]}[waiting] == now
    finally:
        lv.close()
