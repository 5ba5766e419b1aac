"""The drain activity's input (activities/drain.py): a replica to drain, and for how long at most."""

from __future__ import annotations

from pydantic import BaseModel

from scheduler.bounds import Name, Seconds


class DrainAsk(BaseModel):
    instance: Name
    timeout_s: Seconds
