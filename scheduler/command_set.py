"""The commands a host can start, as its agent reports them (worker_agent/capabilities.py): the
names of the executables on its PATH, kept as a Bloom filter so that a report stays small (a
server's PATH holds 1,500 names or more, 17 KB as a list; here about 2 KB, in every report the
host workflow's history keeps). The placement's command filter (filters/command.py) asks it.

A name that is not in the set is surely not on the host's PATH. A name in the set is there, but
for a false positive about 1 time in 100 (``BITS_PER_NAME`` bits a name, ``HASHES`` hashes: the
textbook's (1 - e^(-k n / m))^k = 0.8% at 10 bits and 7 hashes), when the agent refuses the launch
as it always did ("cannot start ..."): the set can only keep a spec from a host that cannot run it,
never from one that can.

Encoded as ``bloom1:<hashes>:<base64 of the bits>``; the bit positions of a name are Kirsch and
Mitzenmacher's ``h1 + i * h2`` over a BLAKE2b digest of it (the same in every process, unlike
Python's salted ``hash``)."""

from __future__ import annotations

import base64
import hashlib
from typing import Iterable

PREFIX = "bloom1"
BITS_PER_NAME = 10
HASHES = 7
MAX_CHARS = 24_000  # of an encoded set: about 14,000 names; a PATH with more is reported as unknown
MIN_BITS = 64


def _positions(name: str, bits: int, hashes: int) -> list[int]:
    d = hashlib.blake2b(name.encode("utf-8", "surrogateescape"), digest_size=16).digest()
    h1, h2 = int.from_bytes(d[:8], "little"), int.from_bytes(d[8:], "little") | 1
    return [(h1 + i * h2) % bits for i in range(hashes)]


def encode(names: Iterable[str]) -> str | None:
    """The set of ``names``; None when it would not fit in MAX_CHARS (then nobody can say)."""
    unique = sorted(set(names))
    bits = max(MIN_BITS, -(-len(unique) * BITS_PER_NAME // 8) * 8)
    field = bytearray(bits // 8)
    for n in unique:
        for p in _positions(n, bits, HASHES):
            field[p // 8] |= 1 << (p % 8)
    out = f"{PREFIX}:{HASHES}:{base64.b64encode(bytes(field)).decode()}"
    return out if len(out) <= MAX_CHARS else None


def holds(encoded: str, name: str) -> bool | None:
    """Whether the set may hold ``name`` (False: surely not); None when ``encoded`` is no set this
    gpuflow can read (a newer agent's, or damaged): unknown, as if none were reported."""
    try:
        prefix, hashes, data = encoded.split(":", 2)
        field = base64.b64decode(data, validate=True)
        k = int(hashes)
    except ValueError:
        return None
    if prefix != PREFIX or not field or not 1 <= k <= 32:
        return None
    bits = len(field) * 8
    return all(field[p // 8] >> (p % 8) & 1 for p in _positions(name, bits, k))
