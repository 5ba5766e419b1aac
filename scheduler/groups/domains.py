"""Topology domains: where a host sits at each layer, and the domains a group can gather into
(GPUStack 2.3.0's topology tree, topology/tree.py and view.py, written as paths).

The layers are the chain root to leaf (layers.chain), keeping a built-in rung (zone, rack) only
where some host carries one of its labels, every layer the cluster declares, and the host last
(GPUStack's "active" layers). A host's path is its domain at each of them, None where it is
unclassified. A domain at a layer is the hosts whose paths agree from the root down to that layer,
so a rack is a rack within its zone (two zones' rack-1 are two domains), and a host unclassified
at the layer is in no domain there: its position is unknown, and unknown is not together.

``tightest`` is the deepest layer a set of hosts shares; one difference from GPUStack: hosts
unclassified at a layer but sharing a classified layer above it (one zone, no rack label) share the
zone here, where GPUStack's tree stops at the unclassified bucket and says they share nothing
(docs/gpustack-differences.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduler.groups.layers import NODE_LAYER, TopologyLayer, chain, domain_of
from scheduler.groups.spec import GatherStrategy, RoleName

if TYPE_CHECKING:  # the snapshot's model is its caller's: `gpuflow deploy` starts without it (issue 37)
    from scheduler.cluster import ClusterSnapshot, Instance, Worker

ANCHORS = (RoleName.PREFILL, RoleName.DECODE)  # the roles that say where a group is (a router holds no weights)
UNCLASSIFIED = "<unclassified>"  # how an unknown position reads in a domain's address and its order

Path = tuple[str | None, ...]


@dataclass(frozen=True)
class Domain:
    """The hosts of one domain. ``layer`` None: the whole cluster (the root, which always fits)."""

    layer: TopologyLayer | None
    path: Path  # its address, root to its layer
    workers: tuple[str, ...]  # in snapshot order

    @property
    def name(self) -> str:
        return self.path[-1] if self.path else "cluster"

    @property
    def address(self) -> list[str]:
        return [UNCLASSIFIED if p is None else p for p in self.path]

    def describe(self) -> str:
        if self.layer is None:
            return "the cluster"
        if self.layer.id == NODE_LAYER:
            return f"host {self.name}"
        return f"{self.layer.name} {' / '.join(p for p in self.path if p is not None)}"


def active_layers(snapshot: ClusterSnapshot, workers: list[Worker] | None = None) -> list[TopologyLayer]:
    """Root to leaf: built-in rungs some host carries, every declared layer, the host."""
    workers = snapshot.workers if workers is None else workers
    declared = {x.id for x in snapshot.topology}
    return [x for x in chain(snapshot.topology)
            if x.id == NODE_LAYER or x.id in declared or any(domain_of(w, x) for w in workers)]


def paths(workers: list[Worker], layers: list[TopologyLayer]) -> dict[str, Path]:
    return {w.name: tuple(domain_of(w, x) for x in layers) for w in workers}


def scopes(workers: list[Worker], layers: list[TopologyLayer]) -> list[tuple[TopologyLayer, list[Domain]]]:
    """Each layer's domains, the host first and then up the chain (GPUStack's scopes): a layer
    above the host where every host is unclassified is left out, as no group can gather there."""
    where = paths(workers, layers)
    out = []
    for k in range(len(layers) - 1, -1, -1):
        groups: dict[Path, list[str]] = {}
        for w in workers:
            p = where[w.name][:k + 1]
            if p[-1] is not None:
                groups.setdefault(p, []).append(w.name)
        if groups or layers[k].id == NODE_LAYER:
            out.append((layers[k], [Domain(layers[k], p, tuple(ws)) for p, ws in groups.items()]))
    return out


def depth(where: dict[str, Path], names: list[str]) -> int:
    """How deep a layer every one of ``names`` shares: k + 1 for the deepest layer k where their
    paths agree from the root down and are classified there; 0: none (only the cluster)."""
    ps = [where[n] for n in names if n in where]
    if not ps:
        return 0
    best = 0
    for k in range(len(ps[0])):
        first = ps[0][:k + 1]
        if first[-1] is not None and all(p[:k + 1] == first for p in ps):
            best = k + 1
    return best


def looser(snapshot: ClusterSnapshot, layers: list[TopologyLayer], shared: int, layer_id: str) -> bool:
    """Whether sharing ``shared`` of ``layers`` (a depth; 0: only the cluster) is looser than the
    layer ``layer_id``, compared on the cluster's full chain (a layer no host carries keeps its place)."""
    full = [x.id for x in chain(snapshot.topology)]
    actual = full.index(layers[shared - 1].id) if shared else -1
    return layer_id in full and actual < full.index(layer_id)


def member_workers(inst: Instance) -> list[str]:
    return ([inst.worker] if inst.worker else []) + [s.worker for s in inst.subordinates if s.worker]


def anchors(snapshot: ClusterSnapshot, group: str) -> list[str]:
    """The workers of the group's prefill and decode members (main and subordinates), once each."""
    out: list[str] = []
    for inst in snapshot.instances:
        if inst.group == group and inst.role in ANCHORS:
            out.extend(w for w in member_workers(inst) if w not in out)
    return out


def floor_at(snapshot: ClusterSnapshot, layer_id: str, group: str) -> Domain | None:
    """The one domain of ``layer_id`` holding every classified anchor of ``group`` (GPUStack's
    GatherFloorFilter). None: no member placed, the layer carried by no host, or the anchors in
    no classified domain there or in several (a floor already broken is reported, not forced)."""
    layers = active_layers(snapshot)
    ids = [x.id for x in layers]
    if layer_id not in ids:
        return None
    k = ids.index(layer_id)
    where = paths(snapshot.workers, layers)
    held = {where[w][:k + 1] for w in anchors(snapshot, group) if w in where and where[w][k] is not None}
    if len(held) != 1:
        return None
    (p,) = held
    return Domain(layers[k], p, tuple(w.name for w in snapshot.workers if where[w.name][:k + 1] == p))


def floor(snapshot: ClusterSnapshot, spec, group: str) -> Domain | None:
    """The floor a group's later members stay inside: under MustGather, the domain of the gather
    layer its placed prefill and decode members occupy; None otherwise (PreferGather only reports)."""
    g = spec.gather
    if g is None or g.strategy != GatherStrategy.MUST_GATHER or not g.layer:
        return None
    return floor_at(snapshot, g.layer, group)
