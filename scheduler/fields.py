"""Field types shared by the cluster snapshot and the model spec: byte sizes with units, and the
strict (extra fields forbidden, frozen) base model both are built from."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from scheduler.limits import MAX_BYTES

# A unit is a prefix (k, M, G, T decimal; Ki, Mi, Gi, Ti binary; the prefix in any case) and
# then an optional B. Bare decimal prefixes ("4G", "4 g") are bytes, as they have always been
# read. A lowercase b means bits ("4 Gb" is 4 gigabits, 500 MB): refused, saying what to write,
# never read as bytes.
_DECIMAL = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_UNITS = {**{p + "B": v for p, v in _DECIMAL.items()}, **{p: v for p, v in _DECIMAL.items()},
          **{p + "B": v for p, v in _BINARY.items()}}  # keys: the prefix lowercased, then "B" or nothing
_PREFIX_NAMES = {"k": "kilo", "m": "mega", "g": "giga", "t": "tera", "ki": "kibi", "mi": "mebi", "gi": "gibi",
                 "ti": "tebi"}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def _unit(unit: str) -> int | None:
    """The bytes of one ``unit`` ("GiB", "gB", "G", ""); None if it is no byte unit."""
    if unit.endswith("b"):  # bits, or not a unit at all: refused either way
        return None
    if unit.endswith("B"):
        return _UNITS.get(unit[:-1].lower() + "B")
    return _UNITS.get(unit.lower())


def _bits(text: str, number: str, unit: str) -> str | None:
    """The refusal of a size written in bits ("4 Gb", "4 gib", "4 b"), saying what to write."""
    prefix = unit[:-1].lower() if unit.endswith("b") else None
    if prefix is None or (prefix and prefix not in _PREFIX_NAMES):
        return None
    why = "(a lowercase b means bits)"
    if prefix == "":
        return f"{text!r} is bits; write '{number} B' for bytes {why}"
    letter = "k" if prefix[0] == "k" else prefix[0].upper()  # kB (SI's lowercase k), MB, GB, TB
    if prefix.endswith("i"):
        return f"{text!r} is {_PREFIX_NAMES[prefix]}bits; write '{number} {prefix[0].upper()}iB' {why}"
    return (f"{text!r} is {_PREFIX_NAMES[prefix]}bits; write '{number} {letter}B' or '{number} {prefix[0].upper()}iB' "
            f"{why}")


@lru_cache(maxsize=1024)
def _size(text: str) -> int:
    """A size string's bytes. Cached: a cluster file spells the same few sizes ("80 GiB") for
    thousands of GPUs, and the regex and float arithmetic were a third of validating one. A bad
    string raises, and lru_cache keeps no exception. parse_bytes passes only short strings here,
    so the cache holds at most 1,024 of at most 32 characters, whatever the input."""
    m = _SIZE.match(text)
    positive = None if m else _SIZE.match(text.strip().removeprefix("-"))
    if positive and (_unit(positive[2]) is not None or _bits(text, positive[1], positive[2])):
        raise ValueError(f"{text!r} is negative; a byte size is 0 or more")
    if m:
        bits = _bits(text, m[1], m[2])
        if bits:
            raise ValueError(bits)
    unit = _unit(m[2]) if m else None
    if unit is None:
        raise ValueError(f"{text!r} is not a byte size (examples: 1073741824, '24 GiB', '512MiB')")
    return int(float(m[1]) * unit)


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
