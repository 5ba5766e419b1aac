"""Field types shared by the cluster snapshot and the model spec: byte sizes with units, and the
strict (extra fields forbidden, frozen) base model both are built from."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from scheduler.limits import MAX_BYTES

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(v: Any) -> Any:
    """'24 GiB' -> 25769803776; ints pass through; anything else is left for pydantic to reject."""
    if isinstance(v, str):
        m = _SIZE.match(v)
        if not m or m[2].lower() not in _UNITS:
            raise ValueError(f"{v!r} is not a byte size (examples: 1073741824, '24 GiB', '512MiB')")
        v = int(float(m[1]) * _UNITS[m[2].lower()])
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v > MAX_BYTES:
        raise ValueError(f"{v} bytes is more than 1 PiB: no machine has that much memory")
    return v


Bytes = Annotated[int, BeforeValidator(parse_bytes), Field(ge=0)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
