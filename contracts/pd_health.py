"""The deployment workflow's check of a prefill/decode group's disaggregation (issue 35): its
activity (activities/pd_health.py) reads the decodes' metrics into the store and judges
``pd_ineffective`` (scheduler/groups/pd_health.py) from them and the gateways' counts."""

from __future__ import annotations

from pydantic import BaseModel, Field

GROUP_PD_HEALTH = "group_pd_health"


class PDHealth(BaseModel):
    """A group's disaggregation now: ``pd_ineffective`` in ``degradations`` while its decodes serve
    requests without remote KV, and what shows it."""

    degradations: list[str] = Field([], max_length=4)  # [] or ["pd_ineffective"]
    why: str = Field("", max_length=500)  # e.g. "gateway: 6 of 6 requests in the last 30 s served without remote KV"
    scraped: int = Field(0, ge=0)  # decodes whose metrics were read this time
