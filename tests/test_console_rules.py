"""Who may act on what in the console (console/rules.py; issue 40, M7): a key's scope
against the tenant that owns the object. Each row: the caller's scope and tenant, the object, and
None (allowed) or the words the refusal must hold."""

from __future__ import annotations

import pytest

from console import rules
from console.access import OPEN, Caller
from console.keys_page import grantable, shown_to

A_ADMIN = ("tenant-admin", "team-a")
CLUSTER = ("cluster-admin", "default")


@pytest.mark.parametrize("who, verb, owner, why", [
    (CLUSTER, "scale", "team-b", None),  # a cluster-admin: any tenant's
    (A_ADMIN, "scale", "team-a", None),  # a tenant-admin: its own tenant's
    (A_ADMIN, "scale", "team-b", "need a tenant-admin key of tenant team-b or a cluster-admin key; yours is a "
                                 "tenant-admin key of tenant team-a"),  # M7: another tenant's deployment
    (A_ADMIN, "delete", "default", "tenant-admin key of tenant default"),  # default's too: it is another tenant
    (("tenant-admin", "default"), "delete", "default", None),
    (("tenant", "team-a"), "scale", "team-a", "yours is a tenant key of tenant team-a"),  # its own, but no admin
    (("metrics", "default"), "scale", "default", "yours is a metrics key"),
])
def test_deployments(who, verb, owner, why):
    got = rules.deployment(*who, verb, "chat", owner)
    assert got == why if why is None else why in got, got


@pytest.mark.parametrize("who, verb, key_tenant, key_scope, why", [
    (CLUSTER, "create", "team-b", "cluster-admin", None),  # everything
    (CLUSTER, "revoke", "team-b", "metrics", None),
    (A_ADMIN, "create", "team-a", "tenant", None),  # its own tenant's tenant keys
    (A_ADMIN, "create", "team-a", "tenant-admin", None),  # and tenant-admin keys
    (A_ADMIN, "create", "team-b", "tenant-admin", "a key of tenant team-b you need a tenant-admin key of tenant "
                                                  "team-b"),  # M7: admin keys for another tenant
    (A_ADMIN, "create", "team-b", "tenant", "a key of tenant team-b"),
    (A_ADMIN, "create", "team-a", "cluster-admin", "a cluster-admin key you need a cluster-admin key"),  # no climbing
    (A_ADMIN, "create", "team-a", "metrics", "a metrics key you need a cluster-admin key"),  # every tenant's series
    (A_ADMIN, "revoke", "team-a", "cluster-admin", "to revoke a cluster-admin key"),
    (("tenant-admin", "default"), "revoke", "default", "cluster-admin", "need a cluster-admin key"),
    (("tenant", "team-a"), "create", "team-a", "tenant", "need a tenant-admin or cluster-admin key"),
    (("metrics", "default"), "revoke", "default", "tenant", "yours is a metrics key"),
])
def test_keys(who, verb, key_tenant, key_scope, why):
    got = rules.key(*who, verb, key_tenant, key_scope)
    assert got == why if why is None else why in got, got


@pytest.mark.parametrize("who, why", [
    (CLUSTER, None),
    (A_ADMIN, "you need a cluster-admin key (hosts serve every tenant)"),  # a host is every tenant's
    (("tenant-admin", "default"), "cluster-admin key"),
    (("tenant", "default"), "cluster-admin key"),
])
def test_hosts(who, why):
    got = rules.host(*who, "cordon", "h1")
    assert got == why if why is None else why in got, got


@pytest.mark.parametrize("caller, shown, offered", [
    (OPEN, (None, None), ["tenant", "tenant-admin", "cluster-admin", "metrics"]),  # the operator's own console
    (Caller("default", True, "cluster-admin", "k0"), (None, None), ["tenant", "tenant-admin", "cluster-admin",
                                                                     "metrics"]),
    (Caller("team-a", True, "tenant-admin", "k1"), ("team-a", None), ["tenant", "tenant-admin"]),  # its tenant
    (Caller("team-a", True, "tenant", "k2"), ("team-a", "k2"), []),  # itself only, and no form
])
def test_what_the_keys_page_shows_and_offers(caller, shown, offered):
    assert shown_to(caller) == shown and grantable(caller) == offered


@pytest.mark.parametrize("caller, tenant, acts", [
    (OPEN, "team-b", True),
    (Caller("team-a", True, "tenant-admin"), "team-a", True),
    (Caller("team-a", True, "tenant-admin"), "team-b", False),
    (Caller("team-a", True, "tenant"), "team-a", False),
])
def test_the_deployment_page_offers_actions_as_the_rule_allows(caller, tenant, acts):
    assert caller.may_act_on(tenant) == acts == (rules.deployment(caller.scope, caller.tenant, "scale", "x", tenant)
                                                 is None)


def test_a_metrics_key_sees_no_console_page():
    assert "reads /metrics only" in rules.console("metrics")
    assert all(rules.console(s) is None for s in ("tenant", "tenant-admin", "cluster-admin"))
