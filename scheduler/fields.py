"""Field types shared by the cluster snapshot and the model spec: byte sizes with units, and the
strict (extra fields forbidden, frozen) base model both are built from."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from scheduler.limits import MAX_BYTES

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


@lru_cache(maxsize=1024)
def _size(text: str) -> int:
    """A size string's bytes. Cached: a cluster file spells the same few sizes ("80 GiB") for
    thousands of GPUs, and the regex and float arithmetic were a third of validating one. A bad
    string raises, and lru_cache keeps no exception. parse_bytes passes only short strings here,
    so the cache holds at most 1,024 of at most 32 characters, whatever the input."""
    m = _SIZE.match(text)
    positive = None if m else _SIZE.match(text.strip().removeprefix("-"))
    if positive and positive[2].lower() in _UNITS:
        raise ValueError(f"{text!r} is negative; a byte size is 0 or more")
    if not m or m[2].lower() not in _UNITS:
        raise ValueError(f"{text!r} is not a byte size (examples: 1073741824, '24 GiB', '512MiB')")
    return int(float(m[1]) * _UNITS[m[2].lower()])


def parse_bytes(v: Any) -> Any:
    """'24 GiB' -> 25769803776; ints pass through; anything else is left for pydantic to reject."""
    if isinstance(v, str):
        v = _size(v) if len(v) <= 32 else _size.__wrapped__(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v > MAX_BYTES:
        raise ValueError(f"{v} bytes is more than 1 PiB: no machine has that much memory")
    return v


Bytes = Annotated[int, BeforeValidator(parse_bytes), Field(ge=0)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
