"""The hosts activities' inputs (activities/hosts.py): a host lost or forgotten, and who holds a
local model path. (What the host agent itself exchanges with the control plane, its report and
its task queue, is contracts/host.py.)"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from contracts.decision import MAX_WORKERS
from contracts.host import CordonReason
from scheduler.bounds import Name, Path, Text


class HostRef(BaseModel):
    name: Name


class HostLost(BaseModel):
    """The host's watch failed: why (the instances placed there are told it)."""

    name: Name
    reason: Text = ""


class HostCordon(BaseModel):
    """A host cordoned (``on``) or uncordoned, as the store records it (records.cordon_worker)."""

    name: Name
    on: bool
    reason: CordonReason = ""


class ReadersAsk(BaseModel):
    """Which hosts to ask to read ``spec``'s local model path (plain JSON, validated as a ModelSpec)."""

    spec: dict[str, Any]


class ModelPaths(BaseModel):
    """Which hosts hold ``path`` and which looked and did not find it; ``instance``: the replica
    whose workflow read it (activities/callers.py: only that workflow may record it)."""

    instance: Name | None = None  # the replica whose workflow read the path (its caller)
    path: Path
    present: list[Name] = Field([], max_length=MAX_WORKERS)
    missing: list[Name] = Field([], max_length=MAX_WORKERS)
