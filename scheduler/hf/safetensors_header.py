"""Weight bytes from safetensors headers, without loading a tensor.

A safetensors file starts with an 8-byte little-endian header length, then that many bytes of
JSON: ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``.
Sharded checkpoints add ``model.safetensors.index.json`` with a ``weight_map``.
"""

from __future__ import annotations

import json
import os
import struct

from scheduler.errors import ModelFileError

MAX_HEADER = 100 * 1024 * 1024  # the format's own limit is 100 MB


def header(path: str) -> dict:
    """The JSON header of one safetensors file, checked against the file's size."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise ModelFileError(path, f"too small to be a safetensors file ({size} bytes)")
            (n,) = struct.unpack("<Q", raw)
            if n > MAX_HEADER or 8 + n > size:
                raise ModelFileError(path, f"header length {n} does not fit in a {size}-byte file")
            text = f.read(n)
    except OSError as e:
        raise ModelFileError(path, f"cannot read: {e.strerror or e}") from None
    try:
        h = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFileError(path, f"header is not valid JSON: {e}") from None
    if not isinstance(h, dict):
        raise ModelFileError(path, "header is not a JSON object")
    data = size - 8 - n
    for name, t in h.items():
        if name == "__metadata__":
            continue
        offs = t.get("data_offsets") if isinstance(t, dict) else None
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)
                and 0 <= offs[0] <= offs[1] <= data):
            raise ModelFileError(path, f"tensor {name!r} has data_offsets {offs!r} outside the {data} data bytes")
    return h


def tensor_bytes(path: str) -> int:
    """Sum of tensor byte ranges in one file."""
    return sum(t["data_offsets"][1] - t["data_offsets"][0]
               for k, t in header(path).items() if k != "__metadata__")


def directory_weight_bytes(model_dir: str) -> tuple[int, list[str]]:
    """Weight bytes of a model directory and the files they came from.

    Safetensors files are costed from their headers (the sharded index's shards when an index is
    present); ``.bin/.pt/.pth`` checkpoints, which have no cheap header, by file size, only when
    there is no safetensors copy (GPUStack counts both, doubling the claim; we do not).
    """
    try:
        names = sorted(os.listdir(model_dir))
    except OSError as e:
        raise ModelFileError(model_dir, f"cannot list: {e.strerror or e}") from None
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ModelFileError(index, f"not a valid safetensors index: {e}") from None
        paths = [os.path.join(model_dir, s) for s in shards]
        for p in paths:
            if not os.path.exists(p):
                raise ModelFileError(p, "shard listed in model.safetensors.index.json is missing")
        return sum(tensor_bytes(p) for p in paths), paths
    st = [n for n in names if n.endswith(".safetensors") and n != "consolidated.safetensors"]
    if st:
        paths = [os.path.join(model_dir, n) for n in st]
        return sum(tensor_bytes(p) for p in paths), paths
    other = [os.path.join(model_dir, n) for n in names if n.endswith((".bin", ".pt", ".pth"))]
    return sum(os.path.getsize(p) for p in other), other
