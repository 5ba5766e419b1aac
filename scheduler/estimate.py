"""Turn a model spec and its local files into a resource request (the one place policy reads files)."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Protocol

from scheduler.errors import InvalidInput, ModelFileError
from scheduler.gguf.estimate import LlamaCppOptions, estimate_items, gpustack_options
from scheduler.gguf.model import GGUFModel, load_model
from scheduler.model_codec import decode_header
from scheduler.gguf.reader import GGUFHeader, read_header
from scheduler.hf import claims
from scheduler.hf.config import ModelParameters, load_parameters
from scheduler.hf.safetensors_header import directory_weight_bytes
from scheduler.params import llama_cpp_options, user_tensor_split
from scheduler.request import FlatRequest, GGUFRequest, Request, zero_vram
from scheduler.spec import Backend, ModelSpec
from scheduler.units import GiB, MiB, gib


def model_path(spec: ModelSpec, override: str | None = None) -> str | None:
    return override or spec.source.local_path


def gguf_request(path: str, params: list[str], base: LlamaCppOptions | None = None) -> GGUFRequest:
    return gguf_request_from_header(read_header(path), params, base)


def gguf_request_from_header(header: GGUFHeader, params: list[str], base: LlamaCppOptions | None = None) -> GGUFRequest:
    model = load_model(header)
    opts, gpu_layers = llama_cpp_options(params, base or gpustack_options())
    items = gguf_items(model, opts)
    total = items[-1].offload_layers
    if gpu_layers is not None and (gpu_layers < 0 or gpu_layers > total):
        gpu_layers = total
    return GGUFRequest(model=model, options=opts, items=items, gpu_layers=gpu_layers,
                       user_tensor_split=user_tensor_split(params))


def gguf_items(model: GGUFModel, opts: LlamaCppOptions) -> list:
    """The estimate for every offload count (items[0]: none, with no VRAM; items[-1]: full)."""
    items = estimate_items(model, replace(opts, gpu_layers=-1), step=1)
    items[0] = zero_vram(items[0])
    return items


def _flat_from_files(spec: ModelSpec, path: str) -> FlatRequest:
    if not os.path.isdir(path):
        raise ModelFileError(path, "not a model directory (expected config.json and weights)")
    weights, files = directory_weight_bytes(path)
    return _flat(spec, path, load_parameters(path), weights, files)


def _flat(spec: ModelSpec, path: str, p: ModelParameters, weights: int, files: list[str]) -> FlatRequest:
    if not files:
        raise ModelFileError(path, "no weight files (*.safetensors, *.bin, *.pt, *.pth)")
    vram = claims.vram_claim(weights, spec.categories)
    factor, overhead = claims.claim_terms(spec.categories)
    overhead_text = f"{overhead // GiB} GiB" if overhead % GiB == 0 else f"{overhead // MiB} MiB"
    ram = spec.resources.ram if spec.resources and spec.resources.ram is not None else 0
    if spec.backend in (Backend.CUSTOM, Backend.VOXBOX):
        ram = claims.custom_ram_claim(vram)
    return FlatRequest(vram=vram, ram=ram, weight_bytes=weights, params=p,
                       kv_bytes_per_token=claims.kv_bytes_per_token(p),
                       basis=f"weights {gib(weights)} GiB x {factor} + {overhead_text}")


def estimate_request(spec: ModelSpec, path_override: str | None = None) -> Request:
    """The model's resource request. ``resources`` in the spec wins over files, as GPUStack's
    GPUSTACK_MODEL_VRAM_CLAIM does; a GGUF source is costed with llama.cpp's model."""
    path = model_path(spec, path_override)
    r = spec.resources
    if r and r.vram is not None:
        ram = r.ram if r.ram is not None else (claims.custom_ram_claim(r.vram) if spec.backend == Backend.CUSTOM else 0)
        params = load_parameters(path) if path and os.path.isfile(os.path.join(path, "config.json")) else None
        return FlatRequest(vram=r.vram, ram=ram, basis="resources in the model spec", params=params)
    if path is None:
        raise InvalidInput(
            f"model {spec.name}: source {spec.source.key} has no local files to estimate from; "
            "pass the local copy (--model-path) or give resources: {vram, ram} in the spec")
    if spec.source.is_gguf or path.endswith(".gguf"):
        return gguf_request(path, spec.backend_parameters)
    return _flat_from_files(spec, path)


def states_resources(spec: ModelSpec) -> bool:
    """The spec states what a replica needs (``resources.vram``): costing it reads nothing."""
    return spec.resources is not None and spec.resources.vram is not None


def needs_files(spec: ModelSpec) -> bool:
    """Whether the estimate reads the model's local path (no ``resources.vram`` in the spec)."""
    return bool(spec.source.local_path) and not states_resources(spec)


class ModelRead(Protocol):
    """What a GPU host read of a local model path, as the estimate reads it (the payload that
    carries it is contracts/estimate_inputs.py ``EstimateInputs``; the encoding, model_codec.py)."""

    path: str
    kind: str  # "gguf" or "hf"
    gguf: Any  # encode_header's fields: a mapping, or a model iterating (field, value) pairs; None if not read
    weight_bytes: int
    weight_files: list[str]


def request_from_inputs(spec: ModelSpec, inputs: ModelRead, params: ModelParameters | None = None) -> Request:
    """The request from what a host read of the spec's local path (``params``: its config.json
    through load_parameters, for a directory). Same result as estimate_request on the host."""
    if states_resources(spec):
        r = spec.resources
        ram = r.ram if r.ram is not None else (claims.custom_ram_claim(r.vram) if spec.backend == Backend.CUSTOM else 0)
        return FlatRequest(vram=r.vram, ram=ram, basis="resources in the model spec", params=params)
    if inputs.kind == "gguf":
        if inputs.gguf is None:
            raise ModelFileError(inputs.path, "the host sent no GGUF header")
        return gguf_request_from_header(decode_header(dict(inputs.gguf)), spec.backend_parameters)
    if spec.source.is_gguf or inputs.path.endswith(".gguf"):
        raise ModelFileError(inputs.path, "not a GGUF file (a directory)")
    if params is None:
        raise ModelFileError(inputs.path, "no config.json: not a Hugging Face model directory")
    return _flat(spec, inputs.path, params, inputs.weight_bytes, inputs.weight_files)
