"""The tenants file (``gpuflow tenants apply FILE``; docs/formats.md):

    tenants:
      - {name: prod, priority: 100, guarantee: {gpus: 8}, limit: {gpus: 32, vram: 2 TiB}}
      - {name: dev,  priority: 30,  limit: {gpus: 16}}
    queueing: BestEffortFIFO   # or StrictFIFO

Resources: ``gpus`` (each GPU a replica holds counts 1), ``vram`` and ``ram`` (bytes claimed).
``guarantee`` is capacity the tenant can always get back by preemption; ``limit`` is a hard cap;
use above the guarantee is borrowing. A resource a quota does not name is unbounded (limit) or
zero (guarantee). ``default`` holds specs without a tenant: no guarantee and no limit unless the
file names it."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from scheduler.fields import Bytes, Strict

NAME = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
RESOURCES = ("gpus", "vram", "ram")
MAX_TENANTS = 10_000  # a file of more is refused: every decision and every gateway reads the whole file


class Quota(Strict):
    gpus: int | None = Field(None, ge=0, le=1_000_000)
    vram: Bytes | None = None
    ram: Bytes | None = None

    def named(self) -> dict[str, int]:
        return {r: getattr(self, r) for r in RESOURCES if getattr(self, r) is not None}


class Tenant(Strict):
    name: str = Field(pattern=NAME, max_length=63)
    priority: int = Field(0, ge=-1_000_000, le=1_000_000)
    guarantee: Quota = Quota()
    limit: Quota = Quota()
    requests_per_s: float | None = Field(None, gt=0, le=1_000_000, description="Gateway: requests a second, then 429.")
    max_concurrent: int | None = Field(None, ge=1, le=1_000_000,
                                       description="Gateway: requests in flight at once, then 429.")

    @model_validator(mode="after")
    def _guarantee_within_limit(self) -> "Tenant":
        for r, g in self.guarantee.named().items():
            lim = getattr(self.limit, r)
            if lim is not None and g > lim:
                raise ValueError(f"tenant {self.name}: guarantee {r} {g} is above its limit {lim}")
        return self


DEFAULT = Tenant(name="default")


class TenantsFile(Strict):
    tenants: list[Tenant] = Field([], max_length=MAX_TENANTS)  # _bounded says so first, without validating them
    queueing: Literal["BestEffortFIFO", "StrictFIFO"] = "BestEffortFIFO"

    MAX_ITEMS: ClassVar[dict[str, int]] = {"tenants": MAX_TENANTS}  # gpuflow/files.py counts them before loading
    _by_name: dict[str, Tenant] = PrivateAttr(default_factory=dict)

    @field_validator("tenants", mode="before")
    @classmethod
    def _bounded(cls, v: Any) -> Any:
        if isinstance(v, (list, tuple)) and len(v) > MAX_TENANTS:
            raise ValueError(f"{len(v):,} tenants; a tenants file may list at most {MAX_TENANTS:,}")
        return v

    @model_validator(mode="after")
    def _unique(self) -> "TenantsFile":
        by_name: dict[str, Tenant] = {}
        dup: set[str] = set()
        for t in self.tenants:
            if t.name in by_name:
                dup.add(t.name)
            by_name[t.name] = t
        if dup:
            shown = sorted(dup)
            more = f" and {len(shown) - 20:,} more" if len(shown) > 20 else ""
            raise ValueError(f"tenant names must be unique; repeated: {', '.join(shown[:20])}{more}")
        self._by_name = by_name
        return self

    def get(self, name: str | None) -> Tenant | None:
        """The tenant called ``name`` (None or "default": the default tenant); None if unknown."""
        name = name or "default"
        found = self._by_name.get(name)
        return found or (DEFAULT if name == "default" else None)
