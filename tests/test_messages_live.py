"""The deployment's messages as the Temporal CLI sends them, to a real deployment (the dev server, a
control-plane worker, one agent): ``temporal workflow update execute --name scale --input 3`` is
still taken (a bare whole number is a ScaleAsk), ``{"replicas": n}`` too, and what does not fit
is refused before it enters the history, the problem named (contracts/deployment.py,
workflows/messages.py). The replicas ask for 200 GiB on a 24 GiB GPU: they wait PENDING, nothing runs."""

from __future__ import annotations

import subprocess

from gpuflow import ops
from gpuflow.dev.temporal import temporal_binary
from tests.live import FAST, Live, cli, spec


def update(lv: Live, name: str, *inputs: str) -> subprocess.CompletedProcess:
    return subprocess.run([temporal_binary(), "workflow", "update", "execute", "--address", lv.stack.temporal.address,
                           "--workflow-id", "deployment/big", "--name", name, *(a for i in inputs for a in ("--input", i))],
                          capture_output=True, text=True, timeout=60)


def accepted_updates(history) -> list[str]:
    return [e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
            for e in history.events if e.HasField("workflow_execution_update_accepted_event_attributes")]


async def test_the_temporal_cli_scales_with_a_bare_number_and_is_refused_what_does_not_fit(tmp_path):
    lv = await Live(str(tmp_path)).start({"h1": [24]})
    try:
        await ops.deploy(lv.client, spec("big", vram_gib=200, replicas=0), FAST)
        h = lv.client.get_workflow_handle("deployment/big")

        out = update(lv, "scale", "3")  # what `gpuflow scale` and the autoscaler send too
        assert out.returncode == 0, out.stderr
        await lv.wait(lambda: len(lv.states("big")) == 3, 60, "3 replicas of big")
        out = update(lv, "scale", '{"replicas": 1}')
        assert out.returncode == 0, out.stderr
        assert (await h.query("status"))["replicas"] == 1

        before = accepted_updates(await h.fetch_history())
        for name, inputs, said in [
            ("scale", ["true"], "scale takes one whole number of replicas >= 0 (or {\"replicas\": n}): replicas: not "
                                "a whole number >= 0 (true, \"3\" and 3.0 are not), got 'True' (bool)"),
            ("scale", ['{"replicas": 1, "by": "me"}'], "by: Extra inputs are not permitted"),
            ("scale", ["1", "2"], "got 2 inputs"),
            ("delete", ["1"], "delete takes no input; it was given 1 ('1')"),
            ("update_spec", ['"big"'], "update_spec takes one model spec JSON object"),
        ]:
            out = update(lv, name, *inputs)
            assert out.returncode != 0 and said in out.stderr + out.stdout, (name, inputs, out.stderr, out.stdout)
        assert accepted_updates(await h.fetch_history()) == before == ["accepted", "scale", "scale"]
        assert (await h.query("status"))["replicas"] == 1
        assert cli(lv, "delete", "big", "--wait").returncode == 0
    finally:
        lv.close()
