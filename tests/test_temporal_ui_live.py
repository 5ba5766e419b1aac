"""Every workflow is readable in the Temporal UI (issue 30): a static summary and details from its
start, and current details as its state changes, read back the way the UI reads them, through
``temporal workflow describe -o json`` (the Temporal CLI) against a real installation."""

from __future__ import annotations

import base64
import json
import subprocess

from gpuflow import ops
from gpuflow.dev.temporal import temporal_binary
from tests.live import FAST, Live, spec


def describe(lv: Live, workflow_id: str) -> dict[str, str]:
    """The UI's view of one workflow: its summary and static details (``temporal workflow
    describe``) and its current details (``temporal workflow metadata``: the query the UI sends)."""
    def temporal(*args: str) -> dict:
        out = subprocess.run([temporal_binary(), "workflow", *args, "--workflow-id", workflow_id, "--address",
                              lv.stack.temporal.address, "-o", "json"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def text(p):  # the CLI shows a payload as its text, or as base64 JSON
        if isinstance(p, dict):
            return json.loads(base64.b64decode(p["data"])) if p.get("data") else ""
        return p or ""

    meta = temporal("describe").get("executionConfig", {}).get("userMetadata", {})
    now = temporal("metadata").get("queryResult", [{}])[0]
    return {"summary": text(meta.get("summary")), "details": text(meta.get("details")),
            "current": text(now.get("currentDetails"))}


async def test_deployment_instance_host_and_autoscaler_read_in_the_ui(tmp_path):
    lv = await Live(str(tmp_path)).start({"h1": [24, 24]})
    try:
        await ops.deploy(lv.client, spec("web", vram_gib=10, tenant=None,
                                         autoscaling={"min_replicas": 1, "max_replicas": 2, "interval_s": 1}), FAST)
        await lv.wait(lambda: lv.states("web") == {"web-0": "running"}, 60, "web-0 RUNNING")

        d = describe(lv, "deployment/web")
        assert d["summary"] == "deployment of web (custom)"
        assert "**model** `local:/models/web`" in d["details"] and "**replicas wanted** 1 (autoscaled)" in d["details"]
        assert "**tenant** `default`" in d["details"] and "**ACTIVE** 1 replica(s) wanted, 1 instance(s)" in d["current"]

        i = describe(lv, "instance/web-0")
        assert i["summary"] == "replica web-0 of web" and "**deployment** `web`" in i["details"]
        assert "**RUNNING**" in i["current"] and "**host** `h1` **GPUs** 0" in i["current"]
        assert "**claim** 10.0 GiB VRAM, 1.0 GiB RAM" in i["current"] and "**decision inputs**" in i["current"]

        h = describe(lv, "host/h1")
        assert h["summary"] == "liveness of host h1" and "**mock-gpus** host, 2 GPU(s)" in h["details"]
        assert "**READY**" in h["current"] and "GPU 1: `Simulated 24G` 24.0 GiB" in h["current"]

        await lv.wait(lambda: "**last step**" in describe(lv, "autoscaler/web")["current"], 30, "an autoscaler step")
        a = describe(lv, "autoscaler/web")
        assert a["summary"] == "autoscaler of web" and "**replicas** 1 to 2" in a["details"]
    finally:
        lv.close()
