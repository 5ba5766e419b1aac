"""The records activities' inputs (activities/records.py): a deployment's row, and the first rows
of a batch of replicas with their workflows. (An instance's own row is an InstanceRecord,
contracts/control.py; which instances' workflows ended is asked with InstanceNames.)"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from contracts.control import InstanceInput
from scheduler.bounds import Name, ShortText, Whole
from scheduler.limits import REPLICAS_CEILING


class SaveDeployment(BaseModel):
    """The deployment's row as its workflow has it: the spec (plain JSON, as the workflow got
    it), the replicas it is scaled to, and its state (active, deleting, deleted)."""

    name: Name
    spec: dict[str, Any]
    replicas: Whole | None = Field(ge=0, le=REPLICAS_CEILING)
    state: ShortText


class StartInstances(BaseModel):
    """A batch of replicas to start: their first rows, then their workflows."""

    instances: list[InstanceInput] = Field([], max_length=REPLICAS_CEILING)
