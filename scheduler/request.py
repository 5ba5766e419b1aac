"""The resource request: a model's needs, computed once per decision from its files (the
analogue of the Kubernetes scheduler's PreFilter writing to CycleState). Filters, selectors and
scorers read it; none of them touches a file."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from scheduler.gguf.estimate import EstimateItem, LlamaCppOptions, Memory, estimate_item
from scheduler.gguf.layers import layers_per_device
from scheduler.gguf.model import GGUFModel
from scheduler.hf.config import ModelParameters
from scheduler.units import MiB

if TYPE_CHECKING:
    from scheduler.learned_claim import LearnedClaim


@dataclass(frozen=True)
class FlatRequest:
    """One VRAM figure per replica (vLLM, SGLang, custom, VoxBox), with how it was reached."""

    vram: int
    ram: int = 0
    basis: str = ""
    weight_bytes: int | None = None
    params: ModelParameters | None = None
    kv_bytes_per_token: int | None = None
    learned: "LearnedClaim | None" = None  # vram is a learned claim, not the estimate (scheduler/learned_claim.py)

    kind = "flat"


@dataclass
class GGUFRequest:
    """llama.cpp's estimate for every offload count (items[0]: none, items[-1]: full), plus a
    memo of tensor-split runs the selectors ask for."""

    model: GGUFModel
    options: LlamaCppOptions
    items: list[EstimateItem]
    gpu_layers: int | None = None  # the user's --gpu-layers, clipped to total layers
    user_tensor_split: list[float] | None = None
    _runs: dict = field(default_factory=dict, repr=False)

    kind = "gguf"

    @property
    def full(self) -> EstimateItem:
        return self.items[-1]

    @property
    def total_layers(self) -> int:
        return self.full.offload_layers

    @property
    def cpu_only(self) -> EstimateItem:
        return self.items[0]

    def layer_vram(self, uma: bool) -> int:
        """VRAM for one offloaded layer: the minimum a GPU must offer to take part."""
        item = next((i for i in self.items if i.vrams and i.vrams[0].handle_layers == 1), self.full)
        return item.vrams[0].uma if uma else item.vrams[0].nonuma

    def one_gpu(self, layers: int) -> EstimateItem:
        """The estimate offloading ``layers`` to one GPU (``total_layers``: everything). Its RAM is
        every split's RAM for that count: the CPU's share does not depend on the split."""
        return self.full if layers >= self.total_layers else self.items[layers]

    def rpc_layer_vram(self, uma: bool) -> int:
        """VRAM an RPC server needs to take one layer: GPUStack's probe, a 1:1 split with one server."""
        v = self.run((1, 1), ("host:80",), gpu_layers=1).vrams[0]
        return v.uma if uma else v.nonuma

    def vram_floor(self, layers: int, uma: bool, remote_nonuma: int = 0, more_local: int = 0) -> int:
        """At most what all GPUs of any tensor split need together to offload ``layers``
        (``total_layers``: everything), so a set of GPUs with less cannot hold them. The base is the
        one-GPU figure of the main worker's kind (``uma``): a split never drops weights, KV cache or
        the main GPU's buffers. Each RPC server on a discrete-memory worker (``remote_nonuma``) adds
        its platform footprint and compute buffers, the same on every server for that count; each
        further GPU of a discrete-memory main worker (``more_local``) its platform footprint. Where
        stray tensors shift the weight placement against the layers, one layer's weights may land
        on a GPU that does not count them: the floor allows for that."""
        key = ("floor", layers, uma, remote_nonuma, more_local)
        if key in self._runs:
            return self._runs[key]
        item = self.one_gpu(layers)
        floor = item.vrams[0].uma if uma else item.vrams[0].nonuma
        if remote_nonuma:
            probe = self.run((1, 1), ("host:80",), gpu_layers=-1 if layers >= self.total_layers else layers).vrams[0]
            floor += remote_nonuma * (probe.nonuma - probe.uma)
        if more_local and not uma:
            floor += more_local * self.options.platform_vram
        if len(self.model.layer_bytes) != self.model.n_layer:
            floor -= max(self.model.layer_bytes)
        self._runs[key] = floor
        return floor

    def rpc_server_floor(self, layers: int) -> tuple[int, int]:
        """(buffers, per layer) for splits with RPC servers: a GPU on a discrete-memory worker
        that takes some of ``layers`` needs at least ``buffers + per_layer * its layers`` (a
        unified-memory one at least ``per_layer * its layers``). Buffers are its platform footprint
        and compute buffers, the least any GPU of such a split has for that count; per layer is the
        least any one layer adds to a GPU (its weights and KV cache, from the one-GPU figures)."""
        key = ("server", layers)
        if key not in self._runs:
            n = -1 if layers >= self.total_layers else layers
            probe = self.run((1, 1), ("host:80",), gpu_layers=n).vrams[0]
            uma = [i.vrams[0].uma for i in self.items[:-1]]
            per_layer = min((b - a for a, b in zip(uma, uma[1:])), default=0)
            self._runs[key] = (probe.nonuma - probe.uma, max(per_layer, 0))
        return self._runs[key]

    def layer_counts(self, tensor_split: tuple[int, ...], gpu_layers: int) -> list[int] | None:
        """Layers per device of ``run(tensor_split, ..., gpu_layers)`` without running it; None
        where stray tensors make weights and layers fall apart (then only a run tells)."""
        if len(self.model.layer_bytes) != self.model.n_layer:
            return None
        split = tuple(float(int(v / MiB) if v >= MiB else v) for v in tensor_split)
        return layers_per_device(self.model.n_layer, split, gpu_layers)

    def run(self, tensor_split: tuple[int, ...], rpc: tuple[str, ...] = (), gpu_layers: int = -1) -> EstimateItem:
        """The estimate with a tensor split (allocatable bytes, turned to MiB as GPUStack does)."""
        split = tuple(int(v / MiB) if v >= MiB else v for v in tensor_split)
        key = (split, len(rpc), gpu_layers)  # servers' names do not change the figures, only their count
        if key not in self._runs:
            opts = replace(self.options, tensor_split=tuple(float(v) for v in split), rpc=rpc, gpu_layers=gpu_layers)
            self._runs[key] = estimate_item(self.model, opts)
        return self._runs[key]


def zero_vram(item: EstimateItem) -> EstimateItem:
    """CPU-only runs allocate nothing on GPUs (GPUStack's clear_vram_claim)."""
    vrams = tuple(Memory(v.handle_layers, v.handle_last_layer, v.handle_output_layer, 0, 0, v.remote, v.position)
                  for v in item.vrams)
    return replace(item, vrams=vrams)


Request = FlatRequest | GGUFRequest
