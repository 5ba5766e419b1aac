"""CPU pinning of an engine (spec ``cpu_pinning: true``, or ``topology_policy: single-numa-node``):
the command is started through a binder that sets its CPU affinity, and its memory policy
where it can, before exec'ing the engine (same pid, so supervision and adoption are unchanged):

- ``numactl --physcpubind=CPUS --membind=NODES -- argv`` where numactl is installed and the
  placement knows the GPUs' NUMA nodes (``--cpunodebind`` when only the nodes are known);
- otherwise ``taskset -c CPUS argv`` (util-linux): CPUs bound, memory not.
Only CPUs this agent may use count (a simulated host may name CPUs this machine lacks). Without
topology data, or with none of the CPUs here, the engine starts unpinned and the reason says so:
pinning is a preference, never a launch failure.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Callable

from scheduler import cpulist
from contracts.agent import LaunchRequest

log = logging.getLogger("gpuflow.agent")


def _plural(what: str, xs: list[int]) -> str:
    return f"{what}{'s' if len(xs) > 1 else ''} {','.join(map(str, xs))}"


def wrap(argv: list[str], req: LaunchRequest, which: Callable[[str], str | None] = shutil.which,
         usable: set[int] | None = None) -> tuple[list[str], str]:
    """(the argv to exec, what it is bound to or why it is not); (argv, "") when pinning is not asked."""
    if not req.cpu_pinning or which(argv[0]) is None:
        return argv, ""  # not asked; or a missing program, which fails to start with its own name
    here = usable if usable is not None else os.sched_getaffinity(0)
    try:  # both come through Temporal: checked, never trusted
        wanted = set(cpulist.parse(req.cpus)) if req.cpus else set()
        if any(not 0 <= n <= cpulist.MAX_CPU for n in req.numa_nodes or []):
            raise ValueError(f"NUMA nodes {req.numa_nodes} are not node numbers")
    except ValueError as e:
        log.warning("cpu pinning skipped for %s: %s", req.key, e)
        return argv, f"cpu pinning skipped: {e}"
    cpus = sorted(wanted & here)
    nodes = req.numa_nodes
    why = None
    if not wanted and not nodes:
        why = f"no topology data for GPUs {req.gpu_indexes} on this host"
    elif wanted and not cpus:
        why = f"none of CPUs {req.cpus} are available here (this agent may use {cpulist.format(here)})"
    if why:
        log.warning("cpu pinning skipped for %s: %s", req.key, why)
        return argv, f"cpu pinning skipped: {why}"
    mine = cpulist.format(cpus)
    if nodes and which("numactl"):
        node_list = ",".join(map(str, nodes))
        bind = f"--physcpubind={mine}" if cpus else f"--cpunodebind={node_list}"
        where = f"CPUs {mine}" if cpus else _plural("the CPUs of NUMA node", nodes)
        return ["numactl", bind, f"--membind={node_list}", "--", *argv], \
            f"pinned to {where}, memory of {_plural('NUMA node', nodes)} (numactl)"
    if not cpus:
        why = f"only NUMA {_plural('node', nodes)} known, and numactl is not installed"
    elif not which("taskset"):
        why = "neither numactl nor taskset is installed"
    if why:
        log.warning("cpu pinning skipped for %s: %s", req.key, why)
        return argv, f"cpu pinning skipped: {why}"
    memory = "memory not bound: numactl is not installed" if nodes else "memory not bound: NUMA node unknown"
    return ["taskset", "-c", mine, *argv], f"pinned to CPUs {mine} ({memory})"


def allowed(pid: int) -> str | None:
    """A running process's CPUs, as /proc/<pid>/status says (Cpus_allowed_list)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Cpus_allowed_list:"):
                    return cpulist.format(cpulist.parse(line.split(":", 1)[1].strip()))
    except OSError:
        return None
    return None
