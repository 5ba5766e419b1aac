"""What the estimator needs from a local model path, as plain data: read on a GPU host that has
the path (the agent's ``read_model_header``), costed on the control plane (``estimate.py``).

- GGUF: the parsed header (metadata with arrays as element type and length, tensor infos, sizes),
  the same :class:`GGUFHeader` the reader gives: a few hundred KB at most, never tensor data.
- A Hugging Face directory: the model parameters its ``config.json`` gives (load_parameters on
  the host, numbers and names only: never the file itself, which a path chosen by a deployer
  could make any JSON file on the host), and the weight bytes the safetensors headers (or
  checkpoint sizes) add up to.

Encoding and decoding are pure; this module reads no file.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from scheduler.gguf.reader import ArrayInfo, GGUFHeader, TensorInfo
from scheduler.hf.config import ModelParameters


class HeaderRequest(BaseModel):
    path: str
    gguf: bool  # read as a GGUF file (else a model directory), as the estimator would


class EstimateInputs(BaseModel):
    path: str
    kind: Literal["gguf", "hf"]
    worker: str = ""  # the host that read it
    mtime_ns: int = 0
    size: int = 0
    gguf: dict[str, Any] | None = None  # encode_header()
    params: dict[str, Any] | None = None  # encode_params(): a directory's ModelParameters, without raw
    weight_bytes: int = 0
    weight_files: list[str] = []

    def stamp(self) -> tuple:
        """What makes two reads the same: the file's path, mtime and size (not the host)."""
        return (self.path, self.kind, self.mtime_ns, self.size)


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


def decode_header(d: dict[str, Any]) -> GGUFHeader:
    return GGUFHeader(path=d["path"], version=d["version"], size=d["size"], model_size=d["model_size"],
                      metadata={k: _unvalue(v) for k, v in d["metadata"].items()},
                      tensors=[TensorInfo(n, tuple(dims), t, off, nb) for n, dims, t, off, nb in d["tensors"]])


def encode_params(p: ModelParameters) -> dict[str, Any]:
    return {f: getattr(p, f) for f in ModelParameters.__dataclass_fields__ if f != "raw"}


def decode_params(d: dict[str, Any]) -> ModelParameters:
    known = {k: v for k, v in d.items() if k in ModelParameters.__dataclass_fields__ and k != "raw"}
    return ModelParameters(**{**known, "architectures": tuple(known.get("architectures", ()))})


class ReaderHosts(BaseModel):
    """The hosts to read a local path on (model_readers.py), and why the others are left out."""

    hosts: list[str] = []
    reasons: list[str] = []
