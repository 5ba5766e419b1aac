"""The PENDING queue's and tenancy's activity input (activities/queue.py): the tenant a spec names."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from scheduler.naming import NAME_MAX
from scheduler.tenancy.config import NAME as TENANT_PATTERN


class TenantAsk(BaseModel):
    """Is ``tenant`` in the tenants file? (None: the spec names none; ``default`` then.)"""

    tenant: Annotated[str, Field(max_length=NAME_MAX, pattern=TENANT_PATTERN)] | None = None  # as a spec's tenant
