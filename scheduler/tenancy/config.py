"""The tenants file (``gpuflow tenants apply FILE``; docs/formats.md):

    tenants:
      - {name: prod, priority: 100, guarantee: {gpus: 8}, limit: {gpus: 32, vram: 2 TiB}}
      - {name: dev,  priority: 30,  limit: {gpus: 16}}
      - {name: research, cohort: lab, guarantee: {gpus: 4}, lending_limit: {gpus: 2},
         flavors: {H100: {guarantee: {gpus: 4}}, "*": {}}, limit: {gpus: 8}}
    queueing: BestEffortFIFO   # or StrictFIFO
    fair_sharing: false

Resources: ``gpus`` (each GPU a replica holds counts 1), ``vram`` and ``ram`` (bytes claimed).
``guarantee`` is capacity the tenant can always get back by preemption; ``limit`` is a hard cap;
use above the guarantee is borrowing. A resource a quota does not name is unbounded (limit) or
zero (guarantee). ``default`` holds specs without a tenant: no guarantee and no limit unless the
file names it.

Kueue's terms (issue 38; scheduler/tenancy/lending.py, flavors.py): ``cohort`` (tenants in one
borrow each other's unused guarantee first), ``lending_limit`` (how much of the guarantee others
may borrow; the rest stays free for the tenant), ``flavors`` (GPU models: a guarantee and a limit
per model; a tenant that lists flavors uses only those models, ``"*"`` naming every other one)
and fair sharing among borrowers (``fair_sharing: true``, each tenant's ``weight``). A file
without them means what it meant before."""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from scheduler.fields import Bytes, Strict

NAME = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
FLAVOR = r"^(\*|[A-Za-z0-9][A-Za-z0-9 ._-]{0,63})$"  # a GPU model as hosts report it ("H100"), or "*"
MAX_FLAVORS = 32
RESOURCES = ("gpus", "vram", "ram")
MAX_TENANTS = 10_000  # a file of more is refused: every decision and every gateway reads the whole file


class Quota(Strict):
    gpus: int | None = Field(None, ge=0, le=1_000_000)
    vram: Bytes | None = None
    ram: Bytes | None = None

    def named(self) -> dict[str, int]:
        return {r: getattr(self, r) for r in RESOURCES if getattr(self, r) is not None}


class Flavor(Strict):
    """One GPU model's quota for a tenant (Kueue's ResourceFlavor quota): GPUs, VRAM and RAM of
    its replicas on GPUs of that model."""

    guarantee: Quota = Field(Quota(), description="Capacity of this GPU model the tenant can always get back by preemption.")
    limit: Quota = Field(Quota(), description="A hard cap on what the tenant holds on GPUs of this model.")
    lending_limit: Quota | None = Field(None, description="How much of this model's guarantee other tenants may "
                                        "borrow while it is unused (none: all of it).")


class Tenant(Strict):
    name: str = Field(pattern=NAME, max_length=63)
    priority: int = Field(0, ge=-1_000_000, le=1_000_000)
    guarantee: Quota = Quota()
    limit: Quota = Quota()
    cohort: str | None = Field(None, pattern=NAME, max_length=63,
                               description="Tenants of one cohort borrow each other's unused guarantee first "
                               "(Kueue's cohort), and a tenant reclaims from them first.")
    lending_limit: Quota | None = Field(None, description="How much of the guarantee other tenants may borrow "
                                        "while it is unused (Kueue's lendingLimit); the rest stays free for this "
                                        "tenant. None: all of it.")
    flavors: dict[Annotated[str, Field(max_length=64)], Flavor] | None = Field(None, max_length=MAX_FLAVORS,
                                              description="GPU models (as hosts report them, matched as a word: "
                                              "'H100' matches 'NVIDIA H100 80GB HBM3') with a guarantee and a limit "
                                              "each; the tenant's replicas use only these models, '*' naming every "
                                              "other. None: any model, no per-model quota.")
    weight: float = Field(1.0, ge=0, le=1_000_000, description="Fair sharing (fair_sharing: true): this tenant's "
                          "weight; its share of what it borrows is divided by it (0: never first).")
    requests_per_s: float | None = Field(None, gt=0, le=1_000_000, description="Gateway: requests a second, then 429.")
    max_concurrent: int | None = Field(None, ge=1, le=1_000_000,
                                       description="Gateway: requests in flight at once, then 429.")
    tokens_per_min: int | None = Field(None, ge=1, le=10**12,
                                       description="Gateway: tokens a minute (prompt and answer, every gateway "
                                                   "together), then 429.")

    @model_validator(mode="after")
    def _guarantee_within_limit(self) -> "Tenant":
        for r, g in self.guarantee.named().items():
            lim = getattr(self.limit, r)
            if lim is not None and g > lim:
                raise ValueError(f"tenant {self.name}: guarantee {r} {g} is above its limit {lim}")
        _lending_within(f"tenant {self.name}", self.guarantee, self.lending_limit)
        for k, f in (self.flavors or {}).items():
            if not re.match(FLAVOR, k):
                raise ValueError(f"tenant {self.name}: flavor {k!r} is not a GPU model name (letters, digits, "
                                 "' ._-', at most 64) or '*'")
            for r, g in f.guarantee.named().items():
                lim = getattr(f.limit, r)
                if lim is not None and g > lim:
                    raise ValueError(f"tenant {self.name}: flavor {k} guarantee {r} {g} is above its limit {lim}")
            _lending_within(f"tenant {self.name} flavor {k}", f.guarantee, f.lending_limit)
        return self

    def guaranteed(self) -> dict[str, int]:
        """The guarantee of each resource: as named, else the sum of the flavors' that name it."""
        out = dict(self.guarantee.named())
        for f in (self.flavors or {}).values():
            for r, g in f.guarantee.named().items():
                if r not in self.guarantee.named():
                    out[r] = out.get(r, 0) + g
        return out


def _lending_within(who: str, guarantee: Quota, lending: Quota | None) -> None:
    for r, lend in (lending.named() if lending else {}).items():
        g = getattr(guarantee, r)
        if g is None:
            raise ValueError(f"{who}: lending_limit {r} names a resource its guarantee does not")
        if lend > g:
            raise ValueError(f"{who}: lending_limit {r} {lend} is above its guarantee {g}")


DEFAULT = Tenant(name="default")


class TenantsFile(Strict):
    tenants: list[Tenant] = Field([], max_length=MAX_TENANTS)  # _bounded says so first, without validating them
    queueing: Literal["BestEffortFIFO", "StrictFIFO"] = "BestEffortFIFO"
    fair_sharing: bool = Field(False, description="Among tenants that borrow, the one with the lowest "
                               "dominant-resource share (its use above its guarantee over the cluster's capacity, "
                               "the largest over resources, divided by its weight) is admitted first and the "
                               "highest is preempted first, as Kueue's fair sharing. False: tenant priority, then "
                               "arrival, as before.")

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
