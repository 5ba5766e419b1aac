"""A spec as people read it (issue 36): its sizes as a spec may write them ("14 GiB"), not as the
store keeps them (bytes: 15032385536). ``readable`` for the console's spec, ``resources`` for
``gpuflow status``. What it writes reads back as the same spec (scheduler/fields.py Bytes)."""

from __future__ import annotations

from typing import Any

GiB, MiB = 2**30, 2**20
SIZES = ("vram", "ram")  # of a spec's ``resources``: bytes per replica


def size(n: Any) -> Any:
    """Bytes as '14 GiB', '1536 MiB', or '13.97 GiB' (two decimals, when neither is whole);
    anything that is not a count is left as it is."""
    if type(n) is not int or n < 0:
        return n
    if n % GiB == 0:
        return f"{n // GiB} GiB"
    if n % MiB == 0:
        return f"{n // MiB} MiB"
    return f"{n / GiB:.2f} GiB"


def readable(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with its ``resources`` in GiB (or MiB) instead of bytes."""
    res = spec.get("resources")
    if not isinstance(res, dict):
        return spec
    return {**spec, "resources": {k: size(v) if k in SIZES else v for k, v in res.items()}}


def resources(spec: dict[str, Any]) -> str | None:
    """'14 GiB VRAM, 2 GiB RAM a replica' where the spec states its resources (None: it does not;
    its request is costed from its model files)."""
    res = spec.get("resources")
    if not isinstance(res, dict):
        return None
    parts = [f"{size(res[k])} {k.upper()}" for k in SIZES if res.get(k) is not None]
    return ", ".join(parts) + " a replica" if parts else None
