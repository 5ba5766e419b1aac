"""The KV connectors each agent reports, live (issue 41): an agent started with ``--kv-connector
nixl`` and one that finds them itself (its ``--vllm`` runs in this test's Python, which has neither
nixl nor mooncake) reach the store, the scheduler's snapshot and ``gpuflow hosts`` (text and JSON),
through the signed hello and the host workflow."""

from __future__ import annotations

import json
import sys

from store import records
from store.snapshot import load_snapshot
from tests.live import Live, cli


async def test_the_agents_kv_connectors_reach_the_snapshot_and_gpuflow_hosts(tmp_path):
    vllm = tmp_path / "vllm"
    vllm.write_text(f"#!{sys.executable}\nraise SystemExit('a stand-in: never launched here')\n")
    vllm.chmod(0o755)
    lv = await Live(str(tmp_path)).start({"finds": [24]}, agent_args=["--vllm", str(vllm)])
    try:
        lv.add_host("states", [24], ["--kv-connector", "nixl"])
        want = {"finds": [], "states": ["nixl"]}  # found none in vLLM's Python; stated nixl
        await lv.wait(lambda: {w.name: w.kv_connectors for w in records.workers(lv.engine) if w.state == "ready"}
                      == want, 60, "both hosts READY with their KV connectors")
        assert {w.name: w.kv_connectors for w in load_snapshot(lv.engine).workers} == want
        listed = json.loads(cli(lv, "hosts", "--json").stdout)
        assert {h["name"]: h["report"]["kv_connectors"] for h in listed} == want
        text = cli(lv, "hosts").stdout
        assert "KV connectors: nixl" in text and "KV connectors: none" in text, text
    finally:
        lv.close()
