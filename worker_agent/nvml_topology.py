"""GPU topology from NVML, per GPU: NUMA node, PCI bus id, NVLink peers, the path to each other
GPU and the CPUs local to it. Every call may be unsupported (old driver, consumer card, no
NVLink, a virtual machine): what NVML does not answer is simply absent.

- NUMA node: ``nvmlDeviceGetNumaNodeId``; failing that, the node whose CPUs (sysfs
  ``/sys/devices/system/node/node*/cpulist``) are the GPU's ``nvmlDeviceGetCpuAffinity``.
- CPUs: ``nvmlDeviceGetCpuAffinity`` (a bitmask, 64 CPUs a word), as a CPU list.
- NVLink peers: each active link (``nvmlDeviceGetNvLinkState`` over links 0..NVML_NVLINK_MAX_LINKS-1)
  named by ``nvmlDeviceGetNvLinkRemotePciInfo(...).busId``; through an NVSwitch the remote end
  is the switch, so pairs that ``nvmlDeviceGetP2PStatus(a, b, NVML_P2P_CAPS_INDEX_NVLINK)``
  reports OK count too. (pynvml's ``NVML_P2P_CAPS_INDEX_READ`` is the tuple ``(0,)``, so
  indexes are passed as plain ints.)
- links: ``nvmlDeviceGetTopologyCommonAncestor`` for each pair.
"""

from __future__ import annotations

import glob
import os
import re

from scheduler import cpulist
from scheduler.cluster import GPU

LEVELS = {0: "internal", 10: "single", 20: "multiple", 30: "hostbridge", 40: "node", 50: "system"}
P2P_NVLINK = 2  # NVML_P2P_CAPS_INDEX_NVLINK
P2P_OK = 0
NVLINK_SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH
_BUS = re.compile(r"^(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F])$")


def _call(fn, *args):
    """NVML's answer, or None when it has none (NVMLError_NotSupported, _NoPermission,
    _FunctionNotFound, a pynvml without the function, ...)."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001  every NVMLError means "not known here"
        return None


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def bus_key(bus_id) -> tuple[int, ...] | None:
    """'00000000:07:00.0' and the legacy '0000:07:00.0' are the same device."""
    m = _BUS.match(_text(bus_id).strip())
    return tuple(int(x or "0", 16) for x in m.groups()) if m else None


def mask_cpus(words) -> list[int]:
    """NVML's CPU bitmask (64 CPUs a word, CPU 0 the lowest bit of word 0) as CPU numbers."""
    return [64 * i + b for i, w in enumerate(words) for b in range(64) if int(w) >> b & 1]


def node_cpus(sysfs: str = "/sys/devices/system/node") -> dict[int, set[int]]:
    """NUMA node -> its CPUs, from sysfs; {} where there is none."""
    out = {}
    for path in glob.glob(os.path.join(sysfs, "node[0-9]*", "cpulist")):
        try:
            with open(path) as f:
                out[int(os.path.basename(os.path.dirname(path))[4:])] = set(cpulist.parse(f.read().strip()))
        except (OSError, ValueError):
            continue
    return out


def _numa(nv, h, cpus: list[int] | None, nodes: dict[int, set[int]]) -> int | None:
    node = _call(nv.nvmlDeviceGetNumaNodeId, h) if hasattr(nv, "nvmlDeviceGetNumaNodeId") else None
    if isinstance(node, int) and node >= 0:
        return node
    if cpus:
        hits = [n for n, cs in nodes.items() if set(cpus) <= cs]
        if len(hits) == 1:
            return hits[0]
    return None


def _nvlink_ends(nv, h) -> tuple[list[tuple[int, ...]], bool]:
    """(PCI keys of the GPUs at the far end of active links, whether NVML answered for any link).
    A link to an NVSwitch names the switch, not a GPU: those pairs come from the P2P status."""
    ends, answered = [], False
    if not hasattr(nv, "nvmlDeviceGetNvLinkState"):
        return ends, answered
    for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
        state = _call(nv.nvmlDeviceGetNvLinkState, h, link)
        answered = answered or state is not None
        if state != 1:
            continue
        kind = _call(getattr(nv, "nvmlDeviceGetNvLinkRemoteDeviceType", lambda *a: None), h, link)
        remote = _call(nv.nvmlDeviceGetNvLinkRemotePciInfo, h, link) if kind != NVLINK_SWITCH else None
        key = bus_key(remote.busId) if remote is not None else None
        if key is not None:
            ends.append(key)
    return ends, answered


_KEPT: dict[tuple, list[dict]] = {}  # the GPUs' uuids -> their topology fields


def annotate(nv, handles: list, gpus: list[GPU], sysfs: str = "/sys/devices/system/node",
             cpu_count: int | None = None, cache: bool = False) -> list[GPU]:
    """``gpus`` (NVML's, in handle order) with the topology NVML answers for (``sysfs`` and
    ``cpu_count``, this host's by default, let tests describe another host). Topology does not
    change while the cards do not, so with ``cache`` it is asked once per set of GPU uuids
    (discovery runs at every inventory heartbeat)."""
    key = tuple(g.uuid for g in gpus)
    if not cache or key not in _KEPT:
        fields = _fields(nv, handles, gpus, sysfs, cpu_count)
        if not cache:
            return _merge(gpus, fields)
        _KEPT.clear()
        _KEPT[key] = fields
    return _merge(gpus, _KEPT[key])


def _merge(gpus: list[GPU], fields: list[dict]) -> list[GPU]:
    return [GPU.model_validate({**g.model_dump(), **f}) if f else g for g, f in zip(gpus, fields)]


def _fields(nv, handles: list, gpus: list[GPU], sysfs: str, cpu_count: int | None) -> list[dict]:
    """Per GPU, the topology fields NVML answered."""
    words = max(1, -(-(cpu_count or os.cpu_count() or 1) // 64))
    nodes = node_cpus(sysfs)
    by_bus: dict[tuple[int, ...], int] = {}
    info = []
    for g, h in zip(gpus, handles):
        pci = _call(nv.nvmlDeviceGetPciInfo, h) if hasattr(nv, "nvmlDeviceGetPciInfo") else None
        bus = _text(pci.busId) if pci is not None else None
        if bus and bus_key(bus):
            by_bus[bus_key(bus)] = g.index
        mask = _call(nv.nvmlDeviceGetCpuAffinity, h, words) if hasattr(nv, "nvmlDeviceGetCpuAffinity") else None
        cpus = mask_cpus(mask) if mask is not None else None
        info.append({"pci_bus_id": bus, "cpus": cpulist.format(cpus) if cpus else None,
                     "numa_node": _numa(nv, h, cpus, nodes)})
    peers: dict[int, set[int]] = {g.index: set() for g in gpus}
    links: dict[int, dict[int, str]] = {g.index: {} for g in gpus}
    known: set[int] = set()  # GPUs whose NVLink state NVML answered (no peers is then a fact)
    for g, h in zip(gpus, handles):
        ends, answered = _nvlink_ends(nv, h)
        peers[g.index] |= {by_bus[k] for k in ends if k in by_bus and by_bus[k] != g.index}
        known |= {g.index} if answered else set()
    for a, ha in zip(gpus, handles):
        for b, hb in zip(gpus, handles):
            if a.index >= b.index:
                continue
            if hasattr(nv, "nvmlDeviceGetP2PStatus") and _call(nv.nvmlDeviceGetP2PStatus, ha, hb, P2P_NVLINK) == P2P_OK:
                peers[a.index].add(b.index)
                peers[b.index].add(a.index)
            lv = LEVELS.get(_call(nv.nvmlDeviceGetTopologyCommonAncestor, ha, hb)) \
                if hasattr(nv, "nvmlDeviceGetTopologyCommonAncestor") else None
            if lv:
                links[a.index][b.index] = links[b.index][a.index] = lv
    out = []
    for g, i in zip(gpus, info):
        more = {k: v for k, v in i.items() if v is not None}
        if peers[g.index] or g.index in known:
            more["nvlink_peers"] = sorted(peers[g.index])
        if links[g.index]:
            more["links"] = links[g.index]
        out.append(more)
    return out
