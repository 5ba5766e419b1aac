"""A prefill/decode group's part of ``gpuflow status`` and the console: each member's role, the
members named but not formed yet, each role's running count against its replicas, and the
degradations (scheduler/groups/status.py), from the deployment's view and its instance rows."""

from __future__ import annotations

from typing import Any

from contracts.deployment import DeploymentView
from scheduler.groups.spec import RoleName, RoleSpec
from scheduler.groups.status import MODEL_BAD, GATHER_UNMET, PD_INEFFECTIVE, RATIO_UNMET, MemberNow, counts, counts_text, ratio_unmet


def roles_of(spec: dict[str, Any]) -> list[RoleSpec]:
    return [RoleSpec.model_validate(r) for r in spec.get("roles") or []]


def group_view(view: DeploymentView, insts: list[dict[str, Any]]) -> dict[str, Any]:
    """The group's part of a deployment's status row: {} for a plain deployment. Each instance row
    gains its ``role`` (None outside a group); members named but not formed yet are rows PENDING with the group's
    ``waiting`` reason (ERROR when its model cannot be estimated); ``group`` says each role's
    running/wanted, the degradations, and ``off`` (its own replicas 0)."""
    roles = roles_of(view.spec)
    if not roles:
        for i in insts:
            i["role"] = None  # every instance row says its role; a plain deployment's have none
        return {}
    listed = {i["name"] for i in insts}
    for i in insts:
        i["role"] = view.members.get(i["name"])
    bad = view.waiting.startswith(MODEL_BAD)  # the spec's fault: ERROR, as a plain replica that gives up
    for name in view.forming:
        if name not in listed:
            insts.append({"name": name, "state": "error" if bad else "pending", "role": view.members.get(name),
                          "reason": view.waiting or "waiting for the group to form"})
    now = [MemberNow(RoleName(i["role"]), i["state"], i.get("worker")) for i in insts if i.get("role")]
    c = counts(roles, now)
    # ratio_unmet from the rows as they are; gather_unmet (its formation) and pd_ineffective (its last
    # check: workflows/pd_watch.py) as the workflow holds them
    kinds = ([RATIO_UNMET] if ratio_unmet(c) else []) + [k for k in (GATHER_UNMET, PD_INEFFECTIVE) if k in view.degraded]
    off = view.spec.get("replicas") == 0  # switched off: every member stopped, its roles' replicas kept
    kinds = [] if off else kinds  # nothing is wanted to run: no ratio unmet
    return {"wanted": 0 if off else sum(want for _, want in c.values()),
            "group": {"off": off, "roles": counts_text(c), "counts": {r.value: {"running": ran, "wanted": want}
                                                         for r, (ran, want) in c.items()},
                      "degradations": kinds, "why": {k: view.degraded_why[k] for k in kinds if k in view.degraded_why},
                      "waiting": view.waiting}}
