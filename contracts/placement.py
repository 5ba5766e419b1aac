"""The placement activities' inputs (activities/placement.py): cost a model, place a replica
(decide and book), book a preemption, ask which victims still run, release a replica's booking,
and rank a deployment's replicas for a scale-down. Each is validated as it arrives: anything that
reaches Temporal may send it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from contracts.decision import DecisionRecord
from scheduler.bounds import Name, ShortText
from contracts.estimate_inputs import EstimateInputs
from scheduler.limits import REPLICAS_CEILING
from scheduler.spec import PlacementStrategy


class EstimateAsk(BaseModel):
    """Cost ``spec`` (plain JSON, validated as a ModelSpec by the activity); ``inputs``: a local
    path as a GPU host read it (workflows/model_read.py), when the spec names one."""

    spec: dict[str, Any]
    inputs: EstimateInputs | None = None


class PlaceAsk(EstimateAsk):
    """Decide and book ``instance``. ``then``: the state the booking records, ``scheduled`` or
    ``starting`` (its launch follows in the same workflow task); checked by the activity, which
    refuses any other for good (a decoding error would be retried)."""

    instance: Name
    then: ShortText = "scheduled"


class PreemptAsk(BaseModel):
    """Book ``decision``'s plan for ``instance`` by taking its victims' GPUs."""

    instance: Name
    decision: DecisionRecord


class ScaleDownAsk(BaseModel):
    """Rank ``live`` (replicas of the deployment ``model``) for removal, by ``strategy``."""

    model: Name
    strategy: PlacementStrategy
    live: list[Name] = Field([], max_length=2 * REPLICAS_CEILING)
