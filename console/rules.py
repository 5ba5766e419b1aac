"""Who may act on what in the console (issue 40, M7): the caller's scope against the tenant that
owns the object, as Kubernetes' RBAC binds a Role within a namespace and a ClusterRole across
them. Each rule answers None (allowed) or why not, naming what is missing; the page answers 403
with it (web.page).

| action                             | cluster-admin | tenant-admin of T              | tenant, metrics |
|------------------------------------|---------------|--------------------------------|-----------------|
| scale, delete a deployment of T    | yes           | yes                            | no              |
| create, revoke a key of T, scope S | yes           | S is tenant or tenant-admin    | no              |
| cordon, uncordon a host            | yes           | no                             | no              |

The open console (no key exists, loopback only) is its operator's own: a cluster-admin. A metrics
key never gets this far (access.caller refuses it every page)."""

from __future__ import annotations

from contracts.scopes import CLUSTER_ADMIN, METRICS, TENANT, TENANT_ADMIN

TENANT_ADMIN_GRANTS = (TENANT, TENANT_ADMIN)  # the scopes a tenant-admin may make or revoke, in its own tenant


def _who(scope: str, tenant: str) -> str:
    return f"yours is a {scope} key of tenant {tenant}"


def deployment(scope: str, tenant: str, verb: str, name: str, owner: str) -> str | None:
    """May a key of ``scope`` and ``tenant`` ``verb`` (scale, delete) deployment ``name`` of tenant ``owner``?"""
    if scope == CLUSTER_ADMIN or (scope == TENANT_ADMIN and tenant == owner):
        return None
    return (f"to {verb} deployment {name!r} of tenant {owner} you need a tenant-admin key of tenant {owner} "
            f"or a cluster-admin key; {_who(scope, tenant)}")


def key(scope: str, tenant: str, verb: str, key_tenant: str, key_scope: str) -> str | None:
    """May a key of ``scope`` and ``tenant`` ``verb`` (create, revoke) a ``key_scope`` key of tenant ``key_tenant``?"""
    if scope == CLUSTER_ADMIN:
        return None
    if scope != TENANT_ADMIN:
        return f"to {verb} API keys you need a tenant-admin or cluster-admin key; {_who(scope, tenant)}"
    if key_tenant != tenant:
        return (f"to {verb} a key of tenant {key_tenant} you need a tenant-admin key of tenant {key_tenant} "
                f"or a cluster-admin key; {_who(scope, tenant)}")
    if key_scope not in TENANT_ADMIN_GRANTS:
        return (f"to {verb} a {key_scope} key you need a cluster-admin key; a tenant-admin key "
                f"{verb}s {' and '.join(TENANT_ADMIN_GRANTS)} keys of its own tenant only")
    return None


def host(scope: str, tenant: str, verb: str, name: str) -> str | None:
    """May a key of ``scope`` and ``tenant`` ``verb`` (cordon, uncordon) host ``name``? Hosts serve every tenant."""
    if scope == CLUSTER_ADMIN:
        return None
    return f"to {verb} host {name!r} you need a cluster-admin key (hosts serve every tenant); {_who(scope, tenant)}"


def console(scope: str) -> str | None:
    """May a key of ``scope`` use the console at all? A metrics key reads /metrics only."""
    return "a metrics key reads /metrics only; sign in with another key" if scope == METRICS else None
