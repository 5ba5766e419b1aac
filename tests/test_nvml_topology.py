"""GPU topology discovery through the NVML seam (worker_agent/nvml_topology.py), with an in-memory
NVML that raises pynvml's own error classes where a call is not supported: a DGX-style box
(NVLink pairs, two sockets), an NVSwitch box, and a 2-socket PCIe box whose driver does not give
the NUMA node (derived from the CPU affinity and sysfs). No GPU machine was lent to this session,
so a real H200 host's answers are not recorded here."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml

from scheduler.cluster import ClusterSnapshot
from scheduler.units import GiB
from tests.test_inventory_nvml import FakeNVML
from worker_agent import nvml_topology
from worker_agent.inventory import discover, from_nvml


def nvml_error(code):
    return pynvml.NVMLError(code)  # pynvml turns the code into its subclass, e.g. NVMLError_NotSupported


NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED


def mask(cpus, words):
    out = [0] * words
    for c in cpus:
        if c < 64 * words:
            out[c // 64] |= 1 << (c % 64)
    return out


class TopoNVML(FakeNVML):
    """Cards carry: bus, numa (None: NumaNodeId not supported), cpus, nvlink {link: remote bus, or
    'switch'} (absent: NVLink not supported), p2p_nvlink (set of indexes), and the host's
    common-ancestor levels in ``levels[(i, j)]``."""

    NVML_NVLINK_MAX_LINKS = 36

    def __init__(self, cards, levels):
        super().__init__(cards)
        self.levels, self.calls = levels, 0

    def _i(self, h):
        return self.cards.index(h)

    def nvmlDeviceGetPciInfo(self, h):  # noqa: N802
        return SimpleNamespace(busId=h["bus"].encode())

    def nvmlDeviceGetNumaNodeId(self, h):  # noqa: N802
        if h.get("numa") is None:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)  # an older driver
        return h["numa"]

    def nvmlDeviceGetCpuAffinity(self, h, words):  # noqa: N802
        if "cpus" not in h:
            raise nvml_error(NOT_SUPPORTED)
        return mask(h["cpus"], words)

    def nvmlDeviceGetNvLinkState(self, h, link):  # noqa: N802
        self.calls += 1
        if "nvlink" not in h:
            raise nvml_error(NOT_SUPPORTED)
        if link >= 18:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1 if link in h["nvlink"] else 0

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):  # noqa: N802
        return pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH if h["nvlink"][link] == "switch" else pynvml.NVML_NVLINK_DEVICE_TYPE_GPU

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):  # noqa: N802
        return SimpleNamespace(busId=h["nvlink"][link].encode())

    def nvmlDeviceGetP2PStatus(self, a, b, index):  # noqa: N802
        assert isinstance(index, int)  # not pynvml's NVML_P2P_CAPS_INDEX_READ, the tuple (0,)
        if index != pynvml.NVML_P2P_CAPS_INDEX_NVLINK:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0 if self._i(b) in a.get("p2p_nvlink", ()) else 5  # NVML_P2P_STATUS_NOT_SUPPORTED

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):  # noqa: N802
        i, j = sorted((self._i(a), self._i(b)))
        if (i, j) not in self.levels:
            raise nvml_error(NOT_SUPPORTED)
        return self.levels[(i, j)]


NODE = {0: list(range(0, 32)) + list(range(64, 96)), 1: list(range(32, 64)) + list(range(96, 128))}
BUS = ["00000000:07:00.0", "00000000:0F:00.0", "00000000:47:00.0", "00000000:4E:00.0",
       "00000000:87:00.0", "00000000:90:00.0", "00000000:B7:00.0", "00000000:BD:00.0"]


def dgx_like() -> TopoNVML:
    """Issue 13's box: NUMA {0-3} {4-7}; NVLink pairs (0,1) (2,3) (4,5) (6,7), two links each,
    the remote end named in the legacy 4-digit-domain form; each pair under one PCIe switch."""
    cards = []
    for i in range(8):
        peer = BUS[i ^ 1].replace("00000000:", "0000:").lower()
        cards.append({"name": "A100-SXM4-80GB", "total": 80 * GiB, "used": 0, "bus": BUS[i], "numa": i // 4,
                      "cpus": NODE[i // 4], "nvlink": {0: peer, 1: peer}})
    levels = {}
    for i in range(8):
        for j in range(i + 1, 8):
            levels[(i, j)] = 10 if i // 2 == j // 2 else 40 if i // 4 == j // 4 else 50  # SINGLE, NODE, SYSTEM
    return TopoNVML(cards, levels)


def test_dgx_like_box(tmp_path):
    nv = dgx_like()
    gpus = nvml_topology.annotate(nv, nv.cards, from_nvml(FakeNVML(nv.cards)), sysfs=str(tmp_path), cpu_count=128)
    g0, g5 = gpus[0], gpus[5]
    assert (g0.numa_node, g0.pci_bus_id, g0.nvlink_peers, g0.cpus) == (0, "00000000:07:00.0", [1], "0-31,64-95")
    assert (g5.numa_node, g5.nvlink_peers, g5.cpus) == (1, [4], "32-63,96-127")
    assert {k: v.value for k, v in g0.links.items()} == {1: "single", 2: "node", 3: "node", 4: "system", 5: "system",
                                                         6: "system", 7: "system"}
    assert nv.calls == 8 * 36  # every link asked once; unsupported high links were skipped, not fatal
    # the snapshot takes what was discovered, and the placement policy reads it
    from scheduler import interconnect

    w = ClusterSnapshot.model_validate({"workers": [{"name": "dgx1", "ram_total": 2**40,
                                                     "gpus": [g.model_dump() for g in gpus]}]}).workers[0]
    assert [interconnect.level(w, s) for s in ([6, 7], [1, 3], [3, 4])] == ["nvlink", "node", "system"]


def test_nvswitch_box_peers_come_from_p2p_status(tmp_path):
    """Every link ends at an NVSwitch: the remote PCI info names the switch, so P2P over NVLink says who is joined."""
    cards = [{"name": "H200", "total": 141 * GiB, "used": 0, "bus": BUS[i], "numa": i // 2, "cpus": NODE[i // 2],
              "nvlink": {k: "switch" for k in range(18)}, "p2p_nvlink": {0, 1, 2, 3} - {i}} for i in range(4)]
    nv = TopoNVML(cards, {})
    gpus = nvml_topology.annotate(nv, nv.cards, from_nvml(FakeNVML(cards)), sysfs=str(tmp_path), cpu_count=128)
    assert [g.nvlink_peers for g in gpus] == [[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]]
    assert all(g.links is None for g in gpus)  # the common ancestor was not supported: absent


def test_pcie_only_box_numa_from_cpu_affinity(tmp_path):
    """No NVLink, no NumaNodeId (older driver): the node is the sysfs node whose CPUs hold the GPU's affinity."""
    for n, cpus in {0: "0-23,48-71", 1: "24-47,72-95"}.items():
        (tmp_path / f"node{n}").mkdir()
        (tmp_path / f"node{n}" / "cpulist").write_text(cpus + "\n")
    sock = {0: list(range(0, 24)) + list(range(48, 72)), 1: list(range(24, 48)) + list(range(72, 96))}
    cards = [{"name": "L40S", "total": 48 * GiB, "used": 0, "bus": BUS[i], "numa": None, "cpus": sock[i // 2]}
             for i in range(4)]
    cards[3].pop("cpus")  # this one's affinity is not supported either: its node stays unknown
    nv = TopoNVML(cards, {(0, 1): 10, (0, 2): 50, (0, 3): 50, (1, 2): 50, (1, 3): 50, (2, 3): 30})
    gpus = nvml_topology.annotate(nv, nv.cards, from_nvml(FakeNVML(cards)), sysfs=str(tmp_path), cpu_count=96)
    assert [g.numa_node for g in gpus] == [0, 0, 1, None]
    assert [g.cpus for g in gpus] == ["0-23,48-71", "0-23,48-71", "24-47,72-95", None]
    assert [g.nvlink_peers for g in gpus] == [None] * 4  # NVLink not supported: unknown, not "none"
    assert gpus[2].links[3].value == "hostbridge" and gpus[0].links[1].value == "single"


def test_agent_discovery_reports_topology_and_an_old_nvml_reports_none():
    nv = dgx_like()
    r = discover("dgx1", nvml=nv)  # this host's sysfs and CPU count; NumaNodeId answers
    assert [g.numa_node for g in r.gpus] == [0, 0, 0, 0, 1, 1, 1, 1] and r.gpus[7].nvlink_peers == [6]
    plain = discover("old", nvml=FakeNVML([{"name": "T4", "total": 16 * GiB, "used": 0}]))
    g = plain.gpus[0]
    assert (g.numa_node, g.nvlink_peers, g.links, g.cpus, g.pci_bus_id) == (None, None, None, None, None)


def test_cpu_masks_and_bus_ids():
    assert nvml_topology.mask_cpus([0b1011, 1 << 63]) == [0, 1, 3, 127]
    assert nvml_topology.bus_key("00000000:4E:00.0") == nvml_topology.bus_key(b"0000:4e:00.0") == (0, 0x4E, 0, 0)
    assert nvml_topology.bus_key("garbage") is None


def test_topology_is_asked_once_per_set_of_cards(tmp_path):
    """Discovery runs at every inventory heartbeat; the real driver's topology is kept by the cards' uuids."""
    nv = dgx_like()
    for i, c in enumerate(nv.cards):
        c["uuid"] = f"GPU-{i:08d}-0000-0000-0000-000000000000"
    first = nvml_topology.annotate(nv, nv.cards, from_nvml(FakeNVML(nv.cards)), sysfs=str(tmp_path), cache=True)
    asked = nv.calls
    again = nvml_topology.annotate(nv, nv.cards, from_nvml(FakeNVML(nv.cards)), sysfs=str(tmp_path), cache=True)
    assert nv.calls == asked and again == first
    nv.cards[0]["uuid"] = "GPU-swapped"  # another card: asked again
    nvml_topology.annotate(nv, nv.cards, from_nvml(FakeNVML(nv.cards)), sysfs=str(tmp_path), cache=True)
    assert nv.calls == 2 * asked
