"""One reason for a PENDING replica, live (issue 36): ``gpuflow status huge`` said "The largest
allocatable GPU has 80.0 GiB" while ``gpuflow queue`` said "70.0 GiB". Why: the queue judged afresh
and showed its verdict unrecorded, the others showed the store's, and nothing judged again when
another replica *took* capacity (activities/pending_reasons.py). Here a 200 GiB replica waits on
one 80 GiB GPU, then a 10 GiB replica takes part of that GPU: status, queue (through the control
plane and from the store), explain, and the console's replica and queue pages all say 70.0 GiB,
the same text. And ``gpuflow deploy`` (no --wait) of a replica no GPU can hold says why, exit 0."""

from __future__ import annotations

import html
import json
import re

import httpx2 as httpx

from gpuflow import ops
from tests import gateway_stack as gs
from tests.live import FAST, Live, cli, spec

NOW = "The largest allocatable GPU has 70.0 GiB"


async def test_status_queue_explain_and_the_console_show_one_reason(tmp_path):
    lv = await Live(str(tmp_path)).start({"gpu-b": [80]})
    g = None
    try:
        # deploy without --wait says why a replica cannot be placed (it said only "created"), and exits 0
        (tmp_path / "huge.json").write_text(spec("huge", vram_gib=200).model_dump_json(exclude_none=True))
        made = cli(lv, "deploy", str(tmp_path / "huge.json"))
        assert made.returncode == 0 and made.stdout.startswith("deployment huge: created"), made
        assert "warning: huge-0: PENDING: unschedulable: " in made.stderr and "has 80.0 GiB" in made.stderr, made.stderr
        assert "'gpuflow deploy --wait' exits 3 for this" in made.stderr
        await lv.wait(lambda: "has 80.0 GiB" in "".join(i.reason or "" for i in lv.instances("huge")), 60,
                      "huge-0 waits for 80 GiB")
        await ops.deploy(lv.client, spec("echo", vram_gib=10), FAST)  # books 10 GiB of the one GPU
        await lv.wait(lambda: [i.state for i in lv.instances("echo")] == ["running"], 90, "echo-0 RUNNING")
        await lv.wait(lambda: NOW in lv.instances("huge")[0].reason, 30, "huge-0's reason follows the capacity taken")
        stored = lv.instances("huge")[0].reason
        status = json.loads(cli(lv, "status", "huge", "--json").stdout)["deployments"][0]["instances"][0]["reason"]
        queue = json.loads(cli(lv, "queue", "--json").stdout)["queue"]
        store = ["--data-dir", lv.stack.data_dir]
        offline = json.loads(cli(lv, "queue", "--json", *store).stdout)["queue"]
        explained = cli(lv, "explain", "huge-0").stdout
        assert status == stored and [q["reason"] for q in queue] == [stored] == [q["reason"] for q in offline]
        assert f"waiting now: {stored}" in explained, explained

        g = gs.gateway(lv.stack.database_url, None, log=str(tmp_path / "gw.log"))
        base = f"http://127.0.0.1:{g.port}/console"
        replica = httpx.get(f"{base}/replicas/huge-0", timeout=30).text
        listed = httpx.get(f"{base}/queue", timeout=30).text
        assert html.escape(stored, quote=False) in _text(replica) and html.escape(stored, quote=False) in _text(listed)
        assert "80.0 GiB" not in _text(replica) + _text(listed)

        # a rolling update whose surge replica cannot be placed waits for its old replica to stop: the
        # deploy's look judges it with the rollout, as --wait does, and says no "exits 3" (it did)
        from gpuflow.deploy_look import judged

        await ops.deploy(lv.client, spec("echo", vram_gib=75, rollout={"surge_timeout_s": 600}), FAST)
        await lv.wait(lambda: any(i.state == "pending" and "unschedulable" in (i.reason or "")
                                  for i in lv.instances("echo")), 60, "echo's surge replica waits")
        seen = {i.name: i.state for i in lv.instances("echo")}
        assert await judged(lv.client, "echo", 1, seen, late=True) == [], seen
    finally:
        if g is not None:
            g.stop()
        lv.close()


def _text(page: str) -> str:
    """A page's text with its markup taken out (its entities left as they are)."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", page))
