"""Cluster policy held by the cluster (issue 38), live: a Temporal dev server, a control-plane
worker started with the live stack's timings (unreachable_grace_s 3), one agent, and two
``gpuflow deploy`` processes whose environments say GPUFLOW_TIMINGS__UNREACHABLE_GRACE_S=1 and
=999. Both deployments' replicas are started with the cluster's grace, 3 (read from each replica
workflow's input in its Temporal history); a spec's per-deployment ``timings.ready_timeout_s``
holds for its own deployment only; a spec may not set a cluster timing; ``gpuflow settings``
prints the cluster's values whatever its own environment says. On the same stack, a key's own
limits set and edited through the control plane (``keys create --requests-per-s``, ``keys edit``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.live import Live, spec


def run(lv: Live, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuflow", *args, "--address", lv.stack.temporal.address],
                          capture_output=True, text=True, timeout=90, env={**os.environ, **env})


async def started_timings(lv: Live, instance: str) -> dict:
    """The timings a replica's workflow was started with (its first event's input)."""
    handle = lv.client.get_workflow_handle(f"instance/{instance}")
    async for event in handle.fetch_history_events():
        got = event.workflow_execution_started_event_attributes.input.payloads[0].data
        return json.loads(got)["timings"]
    raise AssertionError(f"no history for {instance}")


async def test_two_clis_with_different_environments_get_the_clusters_grace(tmp_path):
    lv = await Live(str(tmp_path)).start({"h1": [24, 24]})
    try:
        files = {}
        for name, extra in (("alpha", {}), ("beta", {"timings": {"ready_timeout_s": 45}})):
            raw = spec(name, vram_gib=2).model_dump(mode="json", exclude_none=True) | extra
            files[name] = tmp_path / f"{name}.json"
            files[name].write_text(json.dumps(raw))
        a = run(lv, {"GPUFLOW_TIMINGS__UNREACHABLE_GRACE_S": "1"}, "deploy", str(files["alpha"]), "--wait",
                "--timeout", "60")
        b = run(lv, {"GPUFLOW_TIMINGS__UNREACHABLE_GRACE_S": "999", "GPUFLOW_TIMINGS__READY_TIMEOUT_S": "7"},
                "deploy", str(files["beta"]), "--wait", "--timeout", "60")
        assert a.returncode == 0 and b.returncode == 0, a.stdout + a.stderr + b.stdout + b.stderr
        ta, tb = await started_timings(lv, "alpha-0"), await started_timings(lv, "beta-0")
        print(f"grace: alpha (CLI env 1) {ta['unreachable_grace_s']}, beta (CLI env 999) {tb['unreachable_grace_s']}; "
              f"ready_timeout_s alpha {ta['ready_timeout_s']}, beta (its spec 45, CLI env 7) {tb['ready_timeout_s']}")
        assert ta["unreachable_grace_s"] == tb["unreachable_grace_s"] == lv.t.unreachable_grace_s == 3
        assert ta["ready_timeout_s"] == lv.t.ready_timeout_s and tb["ready_timeout_s"] == 45
        assert {k: v for k, v in ta.items() if k != "ready_timeout_s"} == \
            {k: v for k, v in tb.items() if k != "ready_timeout_s"} == \
            {k: v for k, v in lv.t.model_dump().items() if k != "ready_timeout_s"}

        # a cluster timing is not the spec's to set: refused before any workflow, the field named
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(spec("gamma").model_dump(mode="json", exclude_none=True)
                                  | {"timings": {"unreachable_grace_s": 1}}))
        out = run(lv, {}, "deploy", str(bad))
        assert out.returncode == 2 and "unreachable_grace_s" in out.stderr, out.stdout + out.stderr

        # gpuflow settings: the control plane's values, not this process's environment
        out = run(lv, {"GPUFLOW_TIMINGS__UNREACHABLE_GRACE_S": "999"}, "settings", "--json")
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        assert got["timings"]["unreachable_grace_s"] == 3 and "ready_timeout_s" in got["per_deployment"]
        assert "unreachable_grace_s" not in got["per_deployment"] and got["limits"]["max_replicas"] == 256
        text = run(lv, {}, "settings").stdout
        assert "unreachable_grace_s" in text and "a spec may set its own" in text, text

        # a key's own limits through the control plane (the cluster workflow's create_key and
        # key_limits updates), as gpuflow keys create/edit send them with --address alone
        made = run(lv, {}, "keys", "create", "--tenant", "default", "--requests-per-s", "2", "--tokens-per-min", "900")
        assert made.returncode == 0 and "its own limits: requests_per_s=2, tokens_per_min=900" in made.stdout, made
        kid = made.stdout.splitlines()[1].split("-")[1]
        edited = run(lv, {}, "keys", "edit", kid, "--clear", "tokens_per_min", "--max-concurrent", "3")
        assert edited.returncode == 0 and "limits: requests_per_s=2, max_concurrent=3" in edited.stdout, edited
        listed = json.loads(run(lv, {}, "keys", "list", "--json").stdout)
        mine = next(k for k in listed if k["id"] == kid)
        assert (mine["requests_per_s"], mine["tokens_per_min"], mine["max_concurrent"]) == (2, None, 3)
        out = run(lv, {}, "keys", "edit", kid, "--max-concurrent", "3", "--clear", "max_concurrent")
        assert out.returncode == 2 and "both set and cleared" in out.stderr, out.stderr
    finally:
        lv.close()
