"""A resource request (request.py) as plain JSON data and back, so that a decision's request can
be kept beside it and the decision re-run later (``gpuflow explain --replay``).

- A flat request keeps its figures and the model parameters the selectors read (never the raw
  ``config.json``: load_parameters keeps only the fields the policy reads in the others).
- A GGUF request keeps the model (what the header gave: numbers, names and the last layer's tensor
  infos) and its llama.cpp options; the estimate items are computed again from them, by the same
  function that computed them first (estimate.gguf_items), so they are the same.

Pure: this module reads no file. ``decode`` validates the shape it reads (a field that is missing
or of the wrong kind raises InvalidInput naming it)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from scheduler.errors import InvalidInput
from scheduler.model_codec import decode_params, encode_params
from scheduler.gguf.estimate import LlamaCppOptions
from scheduler.gguf.model import GGUFModel
from scheduler.gguf.reader import TensorInfo
from scheduler.request import FlatRequest, GGUFRequest, Request


def encode(req: Request) -> dict[str, Any]:
    if isinstance(req, FlatRequest):
        return {"kind": "flat", "vram": req.vram, "ram": req.ram, "basis": req.basis,
                "weight_bytes": req.weight_bytes, "kv_bytes_per_token": req.kv_bytes_per_token,
                "params": encode_params(req.params) if req.params is not None else None,
                **({"learned": req.learned.to_dict()} if req.learned is not None else {})}
    model = {f.name: getattr(req.model, f.name) for f in fields(GGUFModel)}
    model["last_layer"] = [[t.name, list(t.dims), t.type_id, t.offset, t.nbytes] for t in req.model.last_layer]
    opts = {f.name: getattr(req.options, f.name) for f in fields(LlamaCppOptions)}
    return {"kind": "gguf", "model": model, "options": opts, "gpu_layers": req.gpu_layers,
            "user_tensor_split": req.user_tensor_split}


def decode(d: Any) -> Request:
    from scheduler.estimate import gguf_items  # estimate.py imports much; only a GGUF request needs it

    if not isinstance(d, dict) or d.get("kind") not in ("flat", "gguf"):
        raise InvalidInput("a recorded request must be an object with kind 'flat' or 'gguf'")
    try:
        if d["kind"] == "flat":
            from scheduler.learned_claim import LearnedClaim

            params = decode_params(d["params"]) if d.get("params") is not None else None
            learned = LearnedClaim.from_dict(d["learned"]) if d.get("learned") is not None else None
            return FlatRequest(vram=int(d["vram"]), ram=int(d["ram"]), basis=str(d["basis"]),
                               weight_bytes=d.get("weight_bytes"), params=params,
                               kv_bytes_per_token=d.get("kv_bytes_per_token"), learned=learned)
        m = dict(d["model"])
        m["last_layer"] = [TensorInfo(str(n), tuple(int(x) for x in dims), int(t), int(o), int(b))
                           for n, dims, t, o, b in m.get("last_layer", [])]
        model = GGUFModel(**{f.name: m[f.name] for f in fields(GGUFModel) if f.name in m})
        o = dict(d["options"])
        for k in ("tensor_split", "rpc"):
            if o.get(k) is not None:
                o[k] = tuple(o[k])
        opts = LlamaCppOptions(**{f.name: o[f.name] for f in fields(LlamaCppOptions) if f.name in o})
        split = d.get("user_tensor_split")
        return GGUFRequest(model=model, options=opts, items=gguf_items(model, opts), gpu_layers=d.get("gpu_layers"),
                           user_tensor_split=[float(x) for x in split] if split is not None else None)
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidInput(f"a recorded {d['kind']} request does not decode: {type(e).__name__}: {e}") from None
