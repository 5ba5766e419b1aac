"""Preemption for a prefill/decode group, whole (issue 41): the victims that make room for every
member at once, or none. Pure, on the same rules as one replica's preemption (preemption.py):

- who may be a victim: the group's tenant stays within its guarantee with the WHOLE group (its
  members' usage on an empty cluster, summed): then replicas of tenants that borrow, only while they
  still borrow; otherwise only lower-priority deployments of its own tenant;
- victim order: Kueue's (preemption.victim_order);
- the set is minimal: victims in order until the group's formation (``form``) on the snapshot
  without them places every member, then every victim it still forms without is spared, in
  reverse. No preemption unless the formation without the victims places the whole group."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.cluster import ClusterSnapshot
from scheduler.dry_run import without
from scheduler.groups.decision import GroupDecision
from scheduler.groups.form import form
from scheduler.groups.spec import RoleName
from scheduler.policy_config import PolicyConfig
from scheduler.request import Request
from scheduler.spec import ModelSpec
from scheduler.tenancy.admission import borrowing, within_guarantee
from scheduler.tenancy.config import TenantsFile
from scheduler.tenancy.preemption import Owners, victim_order
from scheduler.tenancy.usage import Usage, by_tenant, of_candidate, of_instance


@dataclass
class GroupPreemption:
    group: GroupDecision | None  # the formation without the victims; None: no preemption makes room
    victims: list[str] = field(default_factory=list)
    why: str = ""  # the victims' line: "to reclaim lab's guarantee" | "for a higher-priority deployment of its tenant"
    reasons: list[str] = field(default_factory=list)  # no preemption: why not


def need_of(g: GroupDecision) -> Usage:
    out = Usage()
    for m in g.members:
        out = out + of_candidate(m.decision.placement)
    return out


def plan_group(snap: ClusterSnapshot, spec: ModelSpec, requests: dict[RoleName, Request], tenants: TenantsFile,
               owners: Owners, names: set[str], config: PolicyConfig | None = None) -> GroupPreemption:
    """The fewest victims whose GPUs let ``spec``'s group form whole (``names``: its members, never
    victims); no group and no victims when none does."""
    mine = owners.tenant_of.get(spec.name, "default")
    me, my_prio = tenants.get(mine), owners.priority_of.get(spec.name, 0)
    used = by_tenant([i for i in snap.instances if i.name not in names], owners.tenant_of)
    empty = form(without(snap, {i.name for i in snap.instances}), spec, requests, config)
    if not empty.scheduled:
        return GroupPreemption(None, reasons=["preemption: the group does not form even on an empty cluster"])
    reclaim = me is not None and within_guarantee(me, used.get(mine, Usage()), need_of(empty))
    cands = [i for i in snap.instances if i.name not in names and i.worker is not None
             and (owners.tenant_of.get(i.model, "default") != mine and reclaim
                  or owners.tenant_of.get(i.model, "default") == mine and owners.priority_of.get(i.model, 0) < my_prio)]
    forms = lambda gone: form(without(snap, {x.name for x in gone}), spec, requests, config)  # noqa: E731
    taken, left = [], dict(used)
    for v in victim_order(cands, tenants, owners, mine, used):
        t = owners.tenant_of.get(v.model, "default")
        if t != mine and not borrowing(tenants.get(t), left.get(t, Usage())):
            continue  # that tenant is back within its guarantee: no more of its replicas
        taken.append(v)
        left[t] = left.get(t, Usage()) - of_instance(v)
        if forms(taken).scheduled:
            break
    else:
        return GroupPreemption(None, reasons=[f"preemption: no set of preemptible replicas makes room for the whole "
                                              f"group ({len(cands)} candidates)"])
    for v in reversed(list(taken)):
        if forms([x for x in taken if x is not v]).scheduled:
            taken.remove(v)
    g = forms(taken)
    why = f"to reclaim {mine}'s guarantee" if reclaim else "for a higher-priority deployment of its tenant"
    return GroupPreemption(g, [v.name for v in taken], why)
