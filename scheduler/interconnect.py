"""How well a set of GPUs on one worker is joined: the level of each pair, and of the set.

A pair's level, from the best evidence the worker reported (each GPU field is optional):
  1. ``nvlink``: either GPU lists the other in ``nvlink_peers``;
  2. the NVML path in ``links`` (internal, single, multiple, hostbridge, node, system);
  3. ``single`` (one PCIe switch) when both report the same ``pcie_switch``;
  4. ``node`` when both report the same ``numa_node``, ``system`` when they report different ones;
  5. otherwise unknown (None).
A set's level is its worst pair's. Scores (0..100), best first, as the issue orders them (all
pairs on NVLink, then one PCIe switch, then one NUMA node, then across sockets):
  nvlink 100, internal 90, single 80, multiple 70, hostbridge 60, node 50, system 0, unknown 0.
A set of one GPU is ``internal``. Kubernetes' Topology Manager knows NUMA only; NVLink and
PCIe come from NVML here (worker_agent/nvml_topology.py).
"""

from __future__ import annotations

from itertools import combinations

from scheduler import cpulist
from scheduler.cluster import GPU, Link, Worker
from scheduler.memo import ByIdentity

NVLINK = "nvlink"
SCORE = {NVLINK: 100.0, Link.INTERNAL.value: 90.0, Link.SINGLE.value: 80.0, Link.MULTIPLE.value: 70.0,
         Link.HOSTBRIDGE.value: 60.0, Link.NODE.value: 50.0, Link.SYSTEM.value: 0.0}
WHAT = {NVLINK: "all pairs on NVLink", Link.INTERNAL.value: "one board", Link.SINGLE.value: "one PCIe switch",
        Link.MULTIPLE.value: "PCIe switches under one host bridge", Link.HOSTBRIDGE.value: "one host bridge",
        Link.NODE.value: "one NUMA node", Link.SYSTEM.value: "across CPU sockets"}


_MEMO = ByIdentity()  # worker -> {"reports": bool, "groups": [...], (GPU indexes...): level}


def memo(w: Worker) -> dict:
    """What is worked out once per worker report (a report is a new Worker object)."""
    m = _MEMO.get(w)
    return m if m is not None else _MEMO.put(w, {})


def reports(w: Worker) -> bool:
    """Whether the worker reports any topology at all."""
    m = memo(w)
    r = m.get("reports")
    if r is None:
        r = m["reports"] = any(g.numa_node is not None or g.nvlink_peers is not None or g.pcie_switch is not None
                               or g.links is not None for g in w.gpus)
    return r


def pair(a: GPU, b: GPU) -> str | None:
    """The level joining two GPUs of one worker, or None when the worker did not say."""
    if b.index in (a.nvlink_peers or ()) or a.index in (b.nvlink_peers or ()):
        return NVLINK
    path = (a.links or {}).get(b.index) or (b.links or {}).get(a.index)
    if path is not None:
        return path.value
    if a.pcie_switch is not None and a.pcie_switch == b.pcie_switch:
        return Link.SINGLE.value
    if a.numa_node is not None and b.numa_node is not None:
        return Link.NODE.value if a.numa_node == b.numa_node else Link.SYSTEM.value
    return None


def _gpus(w: Worker, indexes) -> list[GPU]:
    return [g for g in (w.gpu(i) for i in indexes) if g is not None]


def level(w: Worker, indexes) -> str | None:
    """The worst pair's level (``internal`` for one GPU); None when some pair is unknown."""
    m, key = memo(w), tuple(indexes)
    if key in m:
        return m[key]
    lv = m[key] = level_of(_gpus(w, indexes))
    return lv


def level_of(gs: list[GPU]) -> str | None:
    """``level`` for GPUs of one worker given as objects."""
    if len(gs) < 2:
        return Link.INTERNAL.value if gs else None
    worst = NVLINK
    for a, b in combinations(gs, 2):
        lv = pair(a, b)
        if lv is None:
            return None
        if SCORE[lv] < SCORE[worst]:
            worst = lv
    return worst


def score(w: Worker, indexes) -> float:
    lv = level(w, indexes)
    return SCORE[lv] if lv is not None else 0.0


def numa_nodes(w: Worker, indexes) -> list[int | None]:
    """The NUMA node of each GPU, in order (None where unknown)."""
    return [g.numa_node for g in _gpus(w, indexes)]


def local_cpus(w: Worker, indexes) -> str | None:
    """The CPUs local to all of these GPUs (the union of their lists, as a CPU list); None when
    any of them did not report its CPUs."""
    gs = _gpus(w, indexes)
    if not gs or any(g.cpus is None for g in gs):
        return None
    return cpulist.format(c for g in gs for c in cpulist.parse(g.cpus))
