"""What crosses Temporal for a prefill/decode group (issue 41): the deployment's calls that form
its group whole, place one more member of a role alone, and name the member a role's scale-in
removes (activities/group_activities.py), and its ``scale_role`` update (workflows/group_steps.py).
Each input is validated as it arrives: anything that reaches Temporal may send it."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from contracts.decision import DecisionRecord, PlacementPlan
from scheduler.bounds import Count, Lines, Name, Text, Whole
from scheduler.groups.spec import RoleName
from scheduler.limits import REPLICAS_CEILING

FORM_GROUP = "form_group"
PLACE_MEMBER = "place_member"
SCALE_IN_MEMBER = "scale_in_member"
DEPLOYMENT_SCALE_ROLE = "scale_role"  # the deployment's update: one role's replicas (RoleScaleAsk)

MAX_MEMBERS = 3 * REPLICAS_CEILING


class MemberRef(BaseModel):
    """A member by name, with its role."""

    name: Name
    role: RoleName


class FormGroupAsk(BaseModel):
    """Form ``deployment``'s group whole: ``spec`` (plain JSON, the group's spec) and its members'
    names, each with its role (as many of each role as the spec says). The activity writes their
    rows (wanted, PENDING) before it decides."""

    deployment: Name
    spec: dict[str, Any]
    members: list[MemberRef] = Field(min_length=1, max_length=MAX_MEMBERS)
    gen: Count = 0  # the group's generation the members join (their rows' group_gen; a whole roll's is the old + 1)


class PlaceMemberAsk(BaseModel):
    """Place one more member of a formed group alone (scheduler/groups/scale_out.py)."""

    deployment: Name
    spec: dict[str, Any]
    member: MemberRef
    gen: Count = 0  # the group's generation the member joins (its row's group_gen)


class MemberPlaced(BaseModel):
    """One member booked: its plan (the ledger holds it) and the decision that placed it."""

    name: Name
    role: RoleName
    plan: PlacementPlan
    decision: DecisionRecord


class GroupPlaced(BaseModel):
    """Every member booked (``scheduled``), or none: then ``reasons`` say why, ``role`` names the
    role that does not fit (None: a tenant's limit, or the capacity moved under every try)."""

    scheduled: bool
    members: list[MemberPlaced] = Field([], max_length=MAX_MEMBERS)
    role: RoleName | None = None
    reasons: Lines = []
    degradations: list[Annotated[str, Field(max_length=64)]] = Field([], max_length=8)
    victims: list[Name] = Field([], max_length=MAX_MEMBERS * 8)  # booked by preempting these (their lines taken)
    preempt_why: Text = ""  # "to reclaim lab's guarantee" | "for a higher-priority deployment of its tenant"
    tenant: Name = "default"  # the group's tenant (a victim is told who took its GPUs)

    @property
    def why(self) -> str:
        return "; ".join(self.reasons)[:2000]


class ScaleInAsk(BaseModel):
    """Which of ``live`` (the group's members now) a scale-in of ``role`` removes."""

    deployment: Name
    spec: dict[str, Any]
    role: RoleName
    live: list[Name] = Field([], max_length=MAX_MEMBERS)


class ScaleInPick(BaseModel):
    victim: Name | None = None
    reasons: Lines = []


class RoleScaleAsk(BaseModel):
    """The deployment's ``scale_role`` update: ``role``'s replicas, the other roles' members untouched."""

    model_config = ConfigDict(extra="forbid")
    TAKES: ClassVar[str] = 'one JSON object {"role": "prefill|decode|router", "replicas": N}'

    role: RoleName
    replicas: Whole = Field(ge=1, le=REPLICAS_CEILING)


class GroupWait(BaseModel):
    """Why the group (or a role's new member) is not placed yet, as the deployment shows it."""

    role: RoleName | None = None
    reason: Text = ""
