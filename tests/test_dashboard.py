"""The Grafana dashboard only plots series gpuflow exports (checked against the real registries)."""

from __future__ import annotations

import json
import os
import re

from prometheus_client import generate_latest

from activities.metrics import ControlMetrics
from contracts.control import HostReport
from store import db
from gateway.metrics import Metrics as GatewayMetrics
from scheduler.cluster import GPU
from worker_agent.metrics import AgentMetrics
from worker_agent.processes import ProcessTable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def exported(tmp_path) -> set[str]:
    engine = db.make_engine(db.sqlite_url(str(tmp_path / "s.db")))
    db.init_db(engine)
    cm = ControlMetrics(engine)
    cm.decisions.labels("scheduled").inc()
    cm.conflicts.labels("rejected").inc()
    report = HostReport(name="h", ram_total=1, gpus=[GPU(index=0, vram_total=8, vram_used=1)])
    am = AgentMetrics("h", lambda: report, ProcessTable(str(tmp_path / "agent")))
    am.launches.labels("h", "vllm", "false").inc()
    am.failures.labels("h", "vllm").inc()
    am.exits.labels("h", "vllm").inc()
    gm = GatewayMetrics()
    for h in (gm.queue_wait, gm.ttft, gm.itl, gm.duration):
        h.labels("m").observe(0.1)
    gm.requests.labels("m", "t", "200").inc()
    gm.tokens.labels("m", "prompt").inc()
    gm.in_flight.labels("m").set(0)
    gm.queue_depth.labels("m").set(0)
    text = (generate_latest(cm.registry) + generate_latest(am.registry) + generate_latest(gm.registry)).decode()
    samples = {ln.split("{")[0].split(" ")[0] for ln in text.splitlines() if ln and not ln.startswith("#")}
    families = {ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE ")}  # declared, even if empty
    return samples | families


def test_every_gpuflow_series_in_the_dashboard_is_exported(tmp_path):
    with open(os.path.join(ROOT, "deploy", "grafana", "gpuflow.json")) as f:
        dash = json.load(f)
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\bgpuflow_[a-z_]+", e)}
    have = exported(tmp_path)
    assert used and used <= have, sorted(used - have)
    assert {"gpuflow_reserved_vram_bytes", "gpuflow_pending_instances", "gpuflow_agent_launches_total"} <= used
