"""Each gateway's demand per limited subject (a tenant, an API key), which every gateway reads to
take its share of the cluster's limits (gateway/limit_shares.py, gateway/tenant_limits.py).

One row per gateway: its id, a JSON object ``{"tenant:NAME" | "key:ID": demand}`` and when it
wrote it. A gateway writes its row and reads every live one in one call (``exchange``) every
``refresh_s``; a row older than ``LIVE_S`` is a gateway gone (its share goes back to the others),
and one older than ``FORGET_S`` is deleted. What another gateway wrote is read as untrusted: a
value that is not a finite number >= 0 counts as 0, and a row past MAX_CHARS as empty."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta

from sqlalchemy import delete
from sqlalchemy.engine import Engine
from sqlmodel import Field, Session, SQLModel, select

from store.serving import LIVE_S
from store.tables import utcnow

FORGET_S = 600.0  # a row this old is deleted
MAX_CHARS = 2_000_000  # a row's JSON, at most (10,000 subjects of ~100 characters, and room)


class GatewayDemandRow(SQLModel, table=True):
    __tablename__ = "gpuflow_gateway_demand"
    gateway: str = Field(primary_key=True)  # the gateway's id (GatewaySettings.gateway_id)
    demand: str = ""  # JSON: subject -> requests a second asked for, plus requests in flight
    updated_at: datetime = Field(default_factory=utcnow)


MAX_DEMAND = 1e6  # one subject's demand counts up to this (requests a second plus in flight): past it, a
# row's number (another gateway's, read from the store) is clipped, so no sum of rows overflows


def _demand(v) -> float | None:
    """A row's number as a demand: clipped to MAX_DEMAND (an int too large for a float too); None
    for what is not a number > 0 (a bool, NaN, infinity, a string)."""
    if type(v) not in (int, float):
        return None
    try:
        f = float(v)
    except OverflowError:
        return MAX_DEMAND if v > 0 else None
    return min(f, MAX_DEMAND) if math.isfinite(f) and f > 0 else None


def parse(text: str) -> dict[str, float]:
    """A row's demand; what is not a finite number > 0 counts as 0 (left out), and a number past
    MAX_DEMAND as MAX_DEMAND."""
    if not text or len(text) > MAX_CHARS:
        return {}
    try:
        got = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(got, dict):
        return {}
    out = {}
    for k, v in got.items():
        d = _demand(v) if isinstance(k, str) else None
        if d is not None:
            out[k] = d
    return out


def exchange(engine: Engine, gateway: str, demand: dict[str, float], now: datetime | None = None,
             live_s: float = LIVE_S) -> dict[str, dict[str, float]]:
    """Write ``gateway``'s demand and read every live gateway's (its own included), in one transaction."""
    now = now or utcnow()
    with Session(engine) as s:
        row = s.get(GatewayDemandRow, gateway) or GatewayDemandRow(gateway=gateway)
        row.demand, row.updated_at = json.dumps(demand, separators=(",", ":")), now
        s.add(row)
        s.exec(delete(GatewayDemandRow).where(GatewayDemandRow.updated_at < now - timedelta(seconds=FORGET_S)))
        s.commit()
        rows = s.exec(select(GatewayDemandRow).where(GatewayDemandRow.updated_at >= now - timedelta(seconds=live_s)))
        return {r.gateway: parse(r.demand) for r in rows}


def forget(engine: Engine, gateway: str) -> None:
    """A gateway shutting down cleanly hands its shares back at once."""
    with Session(engine) as s:
        s.exec(delete(GatewayDemandRow).where(GatewayDemandRow.gateway == gateway))
        s.commit()
