"""What an API key may do: one scope per key (issue 40), read by the gateway (gateway/auth.py),
its console (console/rules.py) and the CLI (``gpuflow keys create --scope``). Plain
names, no pydantic: the CLI reads them when it builds its flags.

- ``tenant``: serves its tenant's models (the default);
- ``tenant-admin``: also acts on its own tenant's deployments and keys, and sees its tenant's figures;
- ``cluster-admin``: everything: every tenant's deployments and keys, hosts, /metrics;
- ``metrics``: reads /metrics, nothing else."""

from __future__ import annotations

TENANT, TENANT_ADMIN, CLUSTER_ADMIN, METRICS = SCOPES = ("tenant", "tenant-admin", "cluster-admin", "metrics")
ADMIN_SCOPES = (TENANT_ADMIN, CLUSTER_ADMIN)
DEFAULT_TENANT = "default"


def admin_scope(tenant: str) -> str:
    """What an admin key of the days before scopes (``--admin``, the store's ``admin`` column) is
    now: cluster-admin for tenant ``default`` (the operator's own), tenant-admin for any other."""
    return CLUSTER_ADMIN if tenant == DEFAULT_TENANT else TENANT_ADMIN
