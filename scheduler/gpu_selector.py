"""A spec's GPU selector: the GPUs its replicas must use (``worker:type:index`` ids), or how many
GPUs each replica takes. Its own module so that a group's roles (scheduler/groups/spec.py) can carry
one without importing the whole spec."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, field_validator

from scheduler.fields import Strict
from scheduler.limits import MAX_GPUS
from scheduler.naming import NAME_MAX

GPU_ID = re.compile(r"^(?P<worker>.+):(?P<type>[^:]+):(?P<index>\d{1,6})$")


class GPUId(Strict):
    worker: str
    type: str
    index: int


class GPUSelector(Strict):
    gpu_ids: list[Annotated[str, Field(max_length=NAME_MAX + 80)]] = Field(default=[], max_length=MAX_GPUS)
    gpus_per_replica: int | None = Field(default=None, ge=1, le=MAX_GPUS)

    @field_validator("gpu_ids")
    @classmethod
    def _well_formed(cls, ids: list[str]) -> list[str]:
        for i in ids:
            if not GPU_ID.match(i):
                raise ValueError(f"GPU id {i!r} is not 'worker:type:index' (example: 'host1:cuda:0')")
        if len(set(ids)) != len(ids):
            raise ValueError("GPU ids repeat")
        return ids

    def parsed(self) -> list[GPUId]:
        out = []
        for i in self.gpu_ids:
            m = GPU_ID.match(i)
            out.append(GPUId(worker=m["worker"], type=m["type"], index=int(m["index"])))
        return out

    def by_worker(self) -> dict[str, list[GPUId]]:
        out: dict[str, list[GPUId]] = {}
        for g in self.parsed():
            out.setdefault(g.worker, []).append(g)
        return out
