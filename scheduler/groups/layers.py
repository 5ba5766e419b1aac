"""Topology layers: where a host sits (zone, rack, any layer the cluster declares, the host itself),
read from its labels. GPUStack 2.3.0's vocabulary (topology/vocabulary.py): its own
``topology.gpustack.ai/...`` key first, then the well-known keys it accepts for the same layer; the
first key a host carries wins. A host that carries none is unclassified at that layer: it costs
placement resolution, never schedulability."""

from __future__ import annotations

import re
from typing import Annotated, Protocol

from pydantic import Field, field_validator

from scheduler.fields import Strict

GPUSTACK_PREFIX = "topology.gpustack.ai/"
NODE_LAYER = "builtin-000004"  # the leaf: the host itself (GPUStack's NODE_LAYER, slug "host")
ZONE_LAYER = "builtin-000001"
RACK_LAYER = "builtin-000003"  # builtin-000002 is retired in GPUStack and never reused
_ID = re.compile(r"^(builtin-\d{6}|custom-[0-9a-f]{6})$")
LabelKey = Annotated[str, Field(min_length=1, max_length=253)]


class TopologyLayer(Strict):
    """One layer between the cluster and the host (GPUStack's TopologyLayer)."""

    id: str = Field(max_length=32)  # builtin-NNNNNN for the vocabulary, custom-<6 hex> for the cluster's own
    name: str = Field(min_length=1, max_length=64)  # its canonical word: zone, rack, nvlink-domain, ...
    label_keys: list[LabelKey] = Field(default=[], max_length=16)  # any of; the first a host carries wins
    parent_layer: str | None = Field(None, max_length=32)  # the layer above; None: under the cluster root

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not _ID.match(v):
            raise ValueError(f"layer id {v[:40]!r} is not builtin-NNNNNN or custom-<6 hex digits>")
        return v


VOCABULARY = (
    TopologyLayer(id=ZONE_LAYER, name="zone", label_keys=[GPUSTACK_PREFIX + "zone", "topology.kubernetes.io/zone"]),
    TopologyLayer(id=RACK_LAYER, name="rack", parent_layer=ZONE_LAYER,
                  label_keys=[GPUSTACK_PREFIX + "rack", "topology.kubernetes.io/rack"]),
)
NODE = TopologyLayer(id=NODE_LAYER, name="host")


def chain_problems(declared: list[TopologyLayer]) -> list[str]:
    """What is wrong with a cluster's declared layers: a reused or reserved id, a parent that is
    neither a vocabulary rung nor declared, two layers under one parent, a cycle."""
    out: list[str] = []
    ids = [x.id for x in declared]
    vocab = {v.id for v in VOCABULARY}
    for i in sorted({i for i in ids if ids.count(i) > 1 or i in vocab or i == NODE_LAYER}):
        out.append(f"topology: layer id {i} is declared twice or is a built-in layer")
    known = vocab | set(ids)
    for x in declared:
        if x.parent_layer is not None and x.parent_layer not in known:
            out.append(f"topology: layer {x.id}'s parent_layer {x.parent_layer} is not a layer")
        if not x.label_keys:
            out.append(f"topology: layer {x.id} names no label_keys (nothing could place a host in it)")
    return out


def chain(declared: list[TopologyLayer]) -> list[TopologyLayer]:
    """The layers root to leaf: the vocabulary's rungs with the cluster's own layers slotted under
    their parents (a layer with no parent hangs off the root, above zone), the host last."""
    below: dict[str | None, list[TopologyLayer]] = {}
    for x in (*VOCABULARY, *declared):
        below.setdefault(x.parent_layer, []).append(x)
    out: list[TopologyLayer] = []
    frontier: list[str | None] = [None]
    seen: set[str] = set()
    while frontier:
        parent = frontier.pop(0)
        # a custom layer under the same parent as a vocabulary rung sits above it (between the two rungs)
        kids = sorted(below.get(parent, []), key=lambda x: (x.id.startswith("builtin-"), x.id))
        for k in kids:
            if k.id not in seen:
                seen.add(k.id)
                out.append(k)
                frontier.append(k.id)
    return [*out, NODE]


def known_layer_ids(declared: list[TopologyLayer]) -> set[str]:
    return {x.id for x in chain(declared)}


class Labelled(Protocol):
    """What a host's place is read from (scheduler/cluster.py Worker)."""

    name: str
    labels: dict[str, str]


def domain_of(worker: Labelled, layer: TopologyLayer) -> str | None:
    """The host's domain at ``layer``: the value of the first of its label keys the host carries;
    at the host layer, the host's own name. None: unclassified at that layer."""
    if layer.id == NODE_LAYER:
        return worker.name
    for key in layer.label_keys:
        value = worker.labels.get(key)
        if value:
            return value
    return None
