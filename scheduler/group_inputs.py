"""What a prefill/decode group's decision saw, and the policy run on it (issue 41): the control
plane's group activity decides with it and ``gpuflow explain MEMBER --replay`` re-runs it later, as
scheduler/decision_inputs.py does for a plain replica.

``GroupInputs`` is everything the group policy reads: the snapshot (with the cluster's topology
layers), the group's spec, each role's request (the router's: its RAM), the members decided by
role in order, the tenants file and the owners, the policy's weights, the worker generations, and
the kind of decision: ``group`` (a formation, scheduler/groups/form.py ``form``: every member at
once) or ``scale_out`` (one member placed alone after formation, scheduler/groups/scale_out.py).
``run_group`` runs that policy; ``placed`` says which member got which Decision. How the inputs
are kept is the store's (store/decision_codec.py ``encode_group``); how a member's record shows
the group's decision is the contract's (contracts/group_decision_of.py). Pure: no store, no clock."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.cluster import ClusterSnapshot
from scheduler.decision import Decision
from scheduler.groups.decision import GroupDecision
from scheduler.groups.form import form
from scheduler.groups.scale_out import scale_out
from scheduler.groups.spec import RoleName
from scheduler.policy_config import PolicyConfig
from scheduler.request import Request
from scheduler.spec import ModelSpec
from scheduler.tenancy.admit import may_preempt
from scheduler.tenancy.config import TenantsFile
from scheduler.tenancy.group_preempt import plan_group
from scheduler.tenancy.preemption import Owners

FORMATION, SCALE_OUT = "group", "scale_out"
KINDS = (FORMATION, SCALE_OUT)


@dataclass
class GroupInputs:
    kind: str  # FORMATION | SCALE_OUT
    snapshot: ClusterSnapshot
    spec: ModelSpec  # the group's spec (with roles)
    group: str  # the deployment whose members these are (Instance.group)
    names: dict[RoleName, list[str]]  # the members decided, by role, in order (scale_out: one member)
    requests: dict[RoleName, Request]  # each role's request (the router's: its RAM)
    tenants: TenantsFile
    owners: Owners
    policy: PolicyConfig
    gens: dict[str, int]  # worker -> generation the snapshot reflects

    def members(self) -> list[str]:
        return [n for ns in self.names.values() for n in ns]

    def role_of(self, name: str) -> RoleName:
        return next(r for r, ns in self.names.items() if name in ns)


def run_group(inp: GroupInputs) -> GroupDecision | Decision:
    """The group policy on ``inp``: a formation's GroupDecision (when the group does not form and its
    tenant may preempt, the formation the fewest victims make room for: scheduler/tenancy/group_preempt.py,
    as the control plane decides), or the member's scale_out Decision."""
    if inp.kind == SCALE_OUT:
        (role, _), = inp.names.items()
        return scale_out(inp.snapshot, inp.spec, role, inp.requests[role], inp.group, inp.policy)
    reqs = {r: q for r, q in inp.requests.items() if r != RoleName.ROUTER}
    g = form(inp.snapshot, inp.spec, reqs, inp.policy)
    if g.scheduled or not may_preempt(inp.spec, inp.tenants, inp.owners):
        return g
    p = plan_group(inp.snapshot, inp.spec, reqs, inp.tenants, inp.owners, set(inp.members()), inp.policy)
    return p.group if p.group is not None and p.group.scheduled else g


def placed(inp: GroupInputs, out: GroupDecision | Decision) -> dict[str, Decision]:
    """Each member placed by ``out``, by name (a formation's members in role order, as the activity
    names them); {} when nothing is placed."""
    if isinstance(out, Decision):
        return {inp.members()[0]: out} if out.scheduled else {}
    if not out.scheduled:
        return {}
    return {inp.names[m.role][m.ordinal]: m.decision for m in out.members}
