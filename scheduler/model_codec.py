"""A model file's read, as plain data and back: the GGUF header (metadata with arrays as element
type and length, tensor infos, sizes: the same :class:`GGUFHeader` the reader gives, never tensor
data) and a Hugging Face directory's :class:`ModelParameters` (numbers and names, never ``raw``).
A GPU host encodes what it read (worker_agent/model_header.py); the estimate decodes it
(estimate.py). The payload that carries them across Temporal is contracts/estimate_inputs.py.

Pure: this module reads no file."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.gguf.reader import ArrayInfo, GGUFHeader, TensorInfo
from scheduler.hf.config import ModelParameters


def _value(v: Any) -> Any:
    if isinstance(v, ArrayInfo):
        return {"array": [v.elem_type, v.count, list(v.values) if v.values is not None else None]}
    return v


def _unvalue(v: Any) -> Any:
    if isinstance(v, dict) and "array" in v:
        elem, count, values = v["array"]
        return ArrayInfo(elem, count, tuple(values) if values is not None else None)
    return v


def encode_header(h: GGUFHeader) -> dict[str, Any]:
    return {"path": h.path, "version": h.version, "size": h.size, "model_size": h.model_size,
            "metadata": {k: _value(v) for k, v in h.metadata.items()},
            "tensors": [[t.name, list(t.dims), t.type_id, t.offset, t.nbytes] for t in h.tensors]}


def decode_header(d: Mapping[str, Any]) -> GGUFHeader:
    """``d``: encode_header's dict, or any mapping with its keys (the contract's validated model)."""
    return GGUFHeader(path=d["path"], version=d["version"], size=d["size"], model_size=d["model_size"],
                      metadata={k: _unvalue(v) for k, v in d["metadata"].items()},
                      tensors=[TensorInfo(n, tuple(dims), t, off, nb) for n, dims, t, off, nb in d["tensors"]])


def encode_params(p: ModelParameters) -> dict[str, Any]:
    return {f: getattr(p, f) for f in ModelParameters.__dataclass_fields__ if f != "raw"}


def decode_params(d: Mapping[str, Any]) -> ModelParameters:
    known = {k: v for k, v in d.items() if k in ModelParameters.__dataclass_fields__ and k != "raw"}
    return ModelParameters(**{**known, "architectures": tuple(known.get("architectures", ()))})
