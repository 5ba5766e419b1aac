"""``gpuflow status`` at size: a line of counts by state for each deployment (and, with --summary,
nothing else but the hosts' counts), and hosts in natural order of name. Pure: rendering a status
dict as ops.status returns it."""

from __future__ import annotations

import pytest

from scheduler.naming import natural_key
from views.render.cluster import counts, status


@pytest.mark.parametrize("states, line", [
    ([], "none"),
    (["running"] * 3, "RUNNING 3"),
    # the most first; equal counts by name
    (["pending", "running", "running", "error", "unreachable"], "RUNNING 2, ERROR 1, PENDING 1, UNREACHABLE 1"),
])
def test_counts(states, line):
    assert counts([{"state": s} for s in states]) == line


def _st() -> dict:
    inst = [{"name": f"m-{k}", "state": s, "worker": "sim-1", "gpu_indexes": [0], "port": 9000 + k, "address": "10.0.0.1"}
            for k, s in enumerate(["running", "running", "pending"])]
    return {"deployments": [{"name": "m", "backend": "custom", "replicas": 3, "deleting": False, "instances": inst}],
            "hosts": [{"name": "sim-1", "state": "ready", "report": {"simulated": True, "gpus": []}},
                      {"name": "sim-2", "state": "not_ready", "report": {"simulated": True, "gpus": []}}]}


def test_full_status_has_the_counts_then_every_row():
    lines = status(_st()).splitlines()
    assert lines[1] == "  instances: RUNNING 2, PENDING 1"
    assert sum(ln.startswith("  m-") for ln in lines) == 3  # a row per instance
    assert any(ln.startswith("sim-2") and "NOT_READY" in ln for ln in lines)  # the hosts' table


def test_summary_is_the_counts_only():
    assert status(_st(), summary=True).splitlines() == [
        'deployment m (custom): 3 replica(s) wanted; requests use "model": "m"',
        "  instances: RUNNING 2, PENDING 1",
        "",
        "hosts: NOT_READY 1, READY 1",
    ]


@pytest.mark.parametrize("names, ordered", [
    (["sim-10", "sim-2", "sim-1", "sim-100"], ["sim-1", "sim-2", "sim-10", "sim-100"]),  # as numbers, not text
    (["gpu-b2", "gpu-a10", "gpu-a9"], ["gpu-a9", "gpu-a10", "gpu-b2"]),  # text first, then the number
    (["h", "h1", "h0"], ["h", "h0", "h1"]),  # a prefix before its longer names
])
def test_hosts_in_natural_order(names, ordered):
    assert sorted(names, key=natural_key) == ordered
