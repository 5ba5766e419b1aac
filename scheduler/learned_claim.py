"""The recommender's state behind a booked learned claim (scheduler/claim_apply.py): kept with the
decision's request (scheduler/request_codec.py, key "learned"), so ``explain --replay`` decides the
same and ``explain`` says why. Pure data."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from scheduler.errors import InvalidInput


@dataclass(frozen=True)
class LearnedClaim:
    """The recommender's state behind a booked learned claim (what ``explain`` prints)."""

    claim: int  # bytes booked per replica
    estimate: int  # bytes the estimate asked for
    fingerprint: str = ""
    samples: int = 0
    span_s: float = 0.0  # the history's length
    percentile: float = 0.9
    margin: float = 0.15
    value: int = 0  # the percentile's bytes, before the margin
    confidence: float = 0.0
    bumped: bool = False  # an OOM, or use over the claim, raised it at once
    floor: int = 0  # the weights: never below

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: Any) -> "LearnedClaim":
        """A kept one, checked field by field (kept inputs are data from a store)."""
        if not isinstance(d, dict):
            raise InvalidInput("a recorded learned claim must be an object")
        out = {}
        for f in fields(LearnedClaim):
            if f.name not in d:
                continue
            v, kind = d[f.name], {"int": int, "float": float, "str": str, "bool": bool}[str(f.type)]
            if kind is float and isinstance(v, int) and not isinstance(v, bool):
                v = float(v)
            if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool:
                raise InvalidInput(f"a recorded learned claim's {f.name} is not a {kind.__name__}")
            out[f.name] = v
        if "claim" not in out or "estimate" not in out or out["claim"] <= 0:
            raise InvalidInput("a recorded learned claim needs a positive claim and the estimate")
        return LearnedClaim(**out)
