"""Values derived from an object that is never changed in place, kept while the object lives
(keyed by identity: pydantic models are not hashable). A snapshot's sums (occupancy.py) and a
worker's GPU groups and link levels (interconnect.py) are computed once, not on every decision."""

from __future__ import annotations

import weakref
from typing import Any


class ByIdentity:
    def __init__(self) -> None:
        self._d: dict[int, tuple[weakref.ref, Any]] = {}

    def get(self, obj: Any) -> Any:
        e = self._d.get(id(obj))
        return e[1] if e is not None and e[0]() is obj else None

    def put(self, obj: Any, value: Any) -> Any:
        key, d = id(obj), self._d

        def forget(ref: weakref.ref, key: int = key) -> None:
            e = d.get(key)
            if e is not None and e[0] is ref:
                d.pop(key, None)

        d[key] = (weakref.ref(obj, forget), value)
        return value

    def __len__(self) -> int:
        return len(self._d)
