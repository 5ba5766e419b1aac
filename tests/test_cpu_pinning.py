"""CPU pinning of engines (worker_agent/pinning.py): real processes bound through taskset, their
affinity read back from /proc/<pid>/status, and the whole path from a spec with
``cpu_pinning: true`` through the placement to ``gpuflow status``. This machine has 2 cores,
so the engine is pinned to one of them (CPU 1). numactl is not installed here: its command line
is checked, but a real --membind run is not."""

from __future__ import annotations

import asyncio

import os
import sys

import pytest
import yaml

from gpuflow import ops
from tests.live import FAST, Live, cli, spec
from worker_agent import pinning
from contracts.agent import LaunchRequest
from worker_agent.processes import ProcessTable

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or 1 not in os.sched_getaffinity(0),
                                reason="needs CPU 1 among this process's CPUs")


def req(**kw) -> LaunchRequest:
    return LaunchRequest(**{"instance": "m-0", "model": "m", "backend": "custom", "gpu_indexes": [3, 4], **kw})


ARGV = ["serve", "--port", "8000"]
HAS = {"taskset": "/usr/bin/taskset", "numactl": "/usr/bin/numactl", "serve": "/usr/bin/serve"}
TASKSET = {"taskset": "/usr/bin/taskset", "serve": "/usr/bin/serve"}


@pytest.mark.parametrize("r, tools, usable, argv, note", [
    (req(), HAS, {0, 1}, ARGV, ""),  # not asked: untouched
    (req(cpu_pinning=True, cpus="1", numa_nodes=[0]), HAS, {0, 1},
     ["numactl", "--physcpubind=1", "--membind=0", "--", *ARGV], "pinned to CPUs 1, memory of NUMA node 0 (numactl)"),
    (req(cpu_pinning=True, numa_nodes=[0, 1]), HAS, {0, 1},  # nodes known, CPUs not: the nodes' CPUs
     ["numactl", "--cpunodebind=0,1", "--membind=0,1", "--", *ARGV],
     "pinned to the CPUs of NUMA nodes 0,1, memory of NUMA nodes 0,1 (numactl)"),
    (req(cpu_pinning=True, cpus="1", numa_nodes=[0]), TASKSET, {0, 1},
     ["taskset", "-c", "1", *ARGV], "pinned to CPUs 1 (memory not bound: numactl is not installed)"),
    # a simulated host names CPUs 0-31; this agent may use 0-1: the two it has
    (req(cpu_pinning=True, cpus="0-31", numa_nodes=[0]), TASKSET, {0, 1},
     ["taskset", "-c", "0-1", *ARGV], "pinned to CPUs 0-1 (memory not bound: numactl is not installed)"),
    (req(cpu_pinning=True), HAS, {0, 1}, ARGV, "cpu pinning skipped: no topology data for GPUs [3, 4] on this host"),
    (req(cpu_pinning=True, cpus="32-63", numa_nodes=[1]), TASKSET, {0, 1}, ARGV,
     "cpu pinning skipped: none of CPUs 32-63 are available here (this agent may use 0-1)"),
    (req(cpu_pinning=True, cpus="1"), {"serve": "/usr/bin/serve"}, {0, 1}, ARGV,
     "cpu pinning skipped: neither numactl nor taskset is installed"),
    (req(cpu_pinning=True, cpus="1"), {"taskset": "/usr/bin/taskset"}, {0, 1}, ARGV, ""),  # no such program: its own error
    # what comes through Temporal is checked: a bad list, a huge range, a negative node never reach argv
    (req(cpu_pinning=True, cpus="1;rm -rf /"), HAS, {0, 1}, ARGV,
     "cpu pinning skipped: '1;rm -rf /' is not a CPU list (example: '0-15,32-47'): bad part '1;rm -rf /'"),
    (req(cpu_pinning=True, cpus="0-999999999"), HAS, {0, 1}, ARGV,
     "cpu pinning skipped: '0-999999999' is not a CPU list: CPU 999999999 is above 65535"),
    # a negative node is refused when the request is validated (below); the binder checks again
    (req(cpu_pinning=True, cpus="1").model_copy(update={"numa_nodes": [-1]}), HAS, {0, 1}, ARGV,
     "cpu pinning skipped: NUMA nodes [-1] are not node numbers"),
])
def test_the_binder_command(r, tools, usable, argv, note):
    assert pinning.wrap(list(ARGV), r, which=tools.get, usable=usable) == (argv, note)


def test_a_negative_numa_node_is_refused_at_validation():
    with pytest.raises(ValueError, match="numa_nodes.0"):
        req(cpu_pinning=True, cpus="1", numa_nodes=[-1])


async def test_a_real_process_runs_on_the_cpus_it_was_pinned_to(tmp_path):
    table = ProcessTable(str(tmp_path))
    argv, note = pinning.wrap([sys.executable, "-c", "import time; time.sleep(60)"],
                              req(cpu_pinning=True, cpus="1", numa_nodes=[0]))
    assert note.startswith("pinned to CPUs 1")
    rec = table.start("m-0", argv, {}, None)
    try:
        # the binder sets the affinity, then execs the engine under the same pid: wait until the
        # pid runs the engine (under load it may still be the binder, or not yet exec'd at all)
        for _ in range(200):
            with open(f"/proc/{rec.pid}/cmdline", "rb") as f:
                cmd = f.read()
            if b"time.sleep(60)" in cmd and not cmd.startswith(b"taskset"):
                break
            await asyncio.sleep(0.05)
        assert pinning.allowed(rec.pid) == "1"  # /proc/<pid>/status Cpus_allowed_list: the same pid, exec'd
        assert pinning.allowed(os.getpid()) != "1"  # the agent itself is not bound
    finally:
        await table.stop("m-0", 2)


def inventory(path, cpus: str | None, n: int = 1) -> str:
    gpus = [{"index": i, "vram_total": "24 GiB", "name": "Simulated 24G"} for i in range(n)]
    if cpus:
        for g in gpus:
            g.update(numa_node=0, cpus=cpus, nvlink_peers=[j for j in range(n) if j != g["index"]])
    with open(path, "w") as f:
        yaml.safe_dump({"ram_total": "64 GiB", "gpus": gpus}, f)
    return str(path)


async def test_pinned_engine_end_to_end(tmp_path):
    """Host 'numa' reports GPUs 0 and 1 on NUMA node 0, joined by NVLink, with local CPU 1; host
    'plain' reports no topology. The pinned replica (30 GiB: both 24 GiB GPUs) runs on CPU 1 and
    status, explain and hosts say so; the other runs unpinned, with the warning."""
    lv = await Live(str(tmp_path)).start({})
    try:
        lv.stack.start_agent("numa", inventory(tmp_path / "numa.yaml", "1", n=2), labels={"kind": "numa"})
        lv.stack.start_agent("plain", inventory(tmp_path / "plain.yaml", None), labels={"kind": "plain"})
        # 30 GiB: two GPUs, so the custom engine says it splits a replica (scheduler/selectors/custom.py)
        await ops.deploy(lv.client, spec("pinned", 30, cpu_pinning=True, worker_selector={"kind": "numa"},
                                         gpu_selector={"gpus_per_replica": 2}), FAST)
        await ops.deploy(lv.client, spec("loose", cpu_pinning=True, worker_selector={"kind": "plain"}), FAST)
        await lv.wait(lambda: lv.states() == {"pinned-0": "running", "loose-0": "running"}, 90, "both RUNNING")
        rows = {i.name: i for i in lv.instances()}
        assert pinning.allowed(rows["pinned-0"].pid) == "1"
        assert pinning.allowed(rows["loose-0"].pid) == pinning.allowed(os.getpid())
        assert rows["pinned-0"].reason == "pinned to CPUs 1 (memory not bound: numactl is not installed)" \
            or rows["pinned-0"].reason == "pinned to CPUs 1, memory of NUMA node 0 (numactl)"
        assert rows["loose-0"].reason == "cpu pinning skipped: no topology data for GPUs [0] on this host"
        out = cli(lv, "status").stdout
        assert "pinned to CPUs 1" in out and "cpu pinning skipped: no topology data" in out
        plan = (await ops.explain(lv.client, "pinned-0"))["plan"]
        assert (plan["gpu_indexes"], plan["cpus"], plan["numa_nodes"]) == ([0, 1], "1", [0])
        out = cli(lv, "explain", "pinned-0").stdout
        assert "link nvlink, pinned to CPUs 1" in out, out
        out = cli(lv, "hosts").stdout
        assert "topology: NUMA 0: GPUs 0,1 (CPUs 1); NVLink: 0-1" in out, out
    finally:
        lv.close()


def test_the_placements_cpus_stay_on_the_main_worker():
    """SGLang's other ranks are copies of rank 0's request on other hosts: they must not take its CPU list."""
    from scheduler.cluster import Subordinate
    from contracts import launch_parts as topology

    head = topology.sglang_head(req(backend="sglang", cpu_pinning=True, cpus="32-63", numa_nodes=[1]),
                                [Subordinate(worker="h2", gpu_indexes=[0, 1])])
    assert (head.cpu_pinning, head.cpus) == (True, "32-63")
    (_, node), = topology.sglang_nodes(head, [Subordinate(worker="h2", gpu_indexes=[0, 1])], "10.0.0.1:5000")
    assert (node.cpu_pinning, node.cpus, node.numa_nodes) == (False, None, None)
