"""The VRAM column of ``gpuflow status`` and explain's memory lines, from the figures the hosts
report (views/usage.py): a replica over two hosts sums them, one over its claim says so."""

from __future__ import annotations

import pytest

from views.render import cluster, usage
from views.usage import attach
from scheduler.units import GiB, MiB


def host(name: str, *replicas: dict) -> dict:
    return {"name": name, "state": "ready", "report": {"usage": list(replicas)}}


def rep(instance: str, used: int, claimed: int, index: int = 0, measured: str = "nvml") -> dict:
    return {"instance": instance, "gpus": [{"index": index, "used": used, "peak": used, "claimed": claimed}],
            "rss": 512 * MiB, "rss_peak": 512 * MiB, "measured": measured}


@pytest.mark.parametrize("hosts, column, warning", [
    ([host("g1", rep("m-0", int(7.2 * GiB), 8 * GiB))], "7.2/8.0 GiB", ""),
    # over two hosts (llama.cpp over RPC): 5 + 4 = 9 GiB used of 6 + 4 = 10 GiB claimed
    ([host("g1", rep("m-0", 5 * GiB, 6 * GiB)), host("g2", rep("m-0", 4 * GiB, 4 * GiB, index=1))], "9.0/10.0 GiB", ""),
    # one card over its claim (8.5 > 8) is over, even where the sum is not compared
    ([host("g1", rep("m-0", int(8.5 * GiB), 8 * GiB))], "8.5/8.0 GiB",
     "VRAM over its claim: 8.5 GiB used of 8.0 GiB claimed"),
    ([host("g1", rep("m-0", 3 * GiB, 0))], "3.0/- GiB", ""),  # a process without its claim (an older workflow's)
    ([host("g1", rep("m-0", 0, 8 * GiB, measured="none"))], "-", ""),  # no per-process figures on that host
    ([host("g1")], "-", ""),  # not reported (yet)
])
def test_status_shows_used_against_claimed(hosts, column, warning):
    deps = [{"name": "m", "replicas": 1, "backend": "vllm", "instances": [
        {"name": "m-0", "state": "running", "worker": "g1", "gpu_indexes": [0], "reason": ""}]}]
    attach(deps, hosts)
    v = deps[0]["instances"][0].get("vram")
    assert usage.column(v) == column and usage.warning(v) == warning
    line = cluster.status({"deployments": deps}).splitlines()[3]
    assert column in line and (warning in line)


def test_explain_gives_each_hosts_cards_and_the_peak():
    deps = [{"instances": [{"name": "m-0", "state": "running"}]}]
    attach(deps, [host("g1", rep("m-0", int(8.5 * GiB), 8 * GiB))])
    text = "\n".join(usage.lines(deps[0]["instances"][0]["vram"]))
    assert "memory measured (NVML per process): VRAM 8.5/8.0 GiB, peak 8.5 GiB; RSS 0.50 GiB, peak 0.50 GiB" in text
    assert "g1: GPU 0 8.50 (peak 8.50) of 8.00 GiB" in text and "VRAM over its claim" in text
