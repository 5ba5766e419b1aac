"""How a tenant's (or a key's) limit is split among the cluster's gateways. Pure: the caller
passes what every live gateway reported (store/gateway_demand.py), including itself.

Each gateway writes, every ``refresh_s``, its demand per limited subject (``tenant:NAME`` or
``key:ID``): requests a second it was asked for (admitted or refused, smoothed) plus requests it
has in flight. Every gateway reads every live gateway's row and gives itself

    share(me) = weight(me) / sum of every live gateway's weight,
    weight(g) = demand(g) + EPS * mean demand + FLOOR

of the limit: a gateway that sees all of a tenant's traffic holds nearly all of its limit, idle
gateways keep a little (so a first request anywhere is admitted), and with no demand anywhere the
limit is split evenly. The shares of one subject add up to 1 whenever the gateways read the same
rows, so together they admit at most the limit (README: the bound, and what lags).

A concurrency limit is a whole number of requests: it is dealt by largest remainder of
``limit * share``, ties broken by gateway id, so every gateway computes the same deal and the
parts add up to the limit exactly (with more gateways than the limit, some get 0)."""

from __future__ import annotations

import math
from collections.abc import Mapping

EPS = 0.1  # an idle gateway keeps this share of the mean demand as weight
FLOOR = 1e-3  # and at least this, so that no demand anywhere splits the limit evenly

Demands = Mapping[str, float]  # gateway id -> its demand for one subject


def weights(demands: Demands) -> dict[str, float]:
    """Each gateway's weight for one subject (see the module's docstring)."""
    if not demands:
        return {}
    clean = {g: d if isinstance(d, (int, float)) and math.isfinite(d) and d > 0 else 0.0 for g, d in demands.items()}
    mean = sum(clean.values()) / len(clean)
    eps = EPS * mean + FLOOR
    return {g: d + eps for g, d in clean.items()}


def _total(w: dict[str, float]) -> float | None:
    """The weights' sum, or None when it is no use (infinite or not positive: each then weighs the same)."""
    total = sum(w.values())
    return total if math.isfinite(total) and total > 0 else None


def fraction(me: str, demands: Demands) -> float:
    """``me``'s share of a limit (0..1); 1 when ``me`` is the only gateway (or reported nothing:
    it has not read the rows yet)."""
    w = weights(demands)
    if me not in w:
        return 1.0
    total = _total(w)
    return w[me] / total if total is not None else 1.0 / len(w)


def allot(limit: int, me: str, demands: Demands) -> int:
    """``me``'s part of a whole-number limit: largest remainder of ``limit * share``, ties by
    gateway id; the parts of every gateway add up to ``limit``."""
    w = weights(demands)
    if me not in w:
        return limit
    total = _total(w)
    if total is None:
        w, total = {g: 1.0 for g in w}, float(len(w))
    exact = {g: limit * x / total for g, x in w.items()}
    part = {g: math.floor(e) for g, e in exact.items()}
    left = limit - sum(part.values())
    for g in sorted(w, key=lambda g: (part[g] - exact[g], g))[:max(0, left)]:
        part[g] += 1
    return part[me]
