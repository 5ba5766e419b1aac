"""A request in a few fields (JSON) and in one line (people): what the CLI prints and what the
control plane records in workflow histories."""

from __future__ import annotations

from typing import Any

from scheduler.request import Request
from scheduler.units import gib


def request_summary(r: Request) -> dict[str, Any]:
    if r.kind == "gguf":
        full = r.full
        return {"kind": "gguf", "architecture": r.model.architecture, "layers": r.total_layers,
                "context_size": r.options.ctx_size, "full_offload_vram": full.vrams[0].nonuma,
                "full_offload_ram": full.ram.nonuma, "cpu_only_ram": r.cpu_only.ram.nonuma}
    d = {"kind": "flat", "vram": r.vram, "ram": r.ram, "basis": r.basis}
    if r.kv_bytes_per_token:
        d["kv_cache_bytes_per_token"] = r.kv_bytes_per_token
    return d


def summary_text(s: dict[str, Any]) -> str:
    if s["kind"] == "gguf":
        return (f"{s['architecture']} GGUF, {s['layers']} layers, ctx {s['context_size']}: full offload "
                f"{gib(s['full_offload_vram'])} GiB VRAM + {gib(s['full_offload_ram'])} GiB RAM; CPU only {gib(s['cpu_only_ram'])} GiB RAM")
    return f"{gib(s['vram'])} GiB VRAM, {gib(s['ram'])} GiB RAM ({s['basis']})"
