"""A prefill/decode group in its deployment's workflow (issue 41): formed whole, then kept per role.

- **Formation.** With no member started, the group's members are named (``<name>-<n>``, each with its
  role) and ``form_group`` writes their rows, decides the whole group and books every member in one
  ledger transaction, or nothing. Only then is each member's instance workflow started, with its
  booking (placement and decision) carried and its role's effective spec (``role_spec``): no
  member's engine starts before every member holds its booking. Not formed: the members wait
  PENDING (their rows and this workflow's status say why, naming the role), and the formation is
  tried again after a backoff (RETRY_S, doubling to RETRY_CAP_S). The PENDING queue's wake does not
  reach a deployment, so the retry is this timer (the queue leaves group members out).
- **Per role.** ``scale_role`` (RoleScaleAsk) changes one role's replicas: one more member is placed
  alone (``place_member``: scale_out beside the group), one fewer stops the member ``scale_in_member``
  names (the retention scorer's victim). No other member restarts. A member that ends on its own is
  replaced the same way, alone.
- **A change of the spec** that replaces members rolls the group (workflows/group_roll.py; which way:
  scheduler/groups/compat.py): role by role with the ordinary rollout when old and new members can
  still hand KV across, else whole: a new generation beside the old (GPUStack restarts the group).
A group's autoscaling is per role (``group_problem``: scheduler/autoscale/roles.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contracts.control import ClosedInstances, DeploymentInput, InstanceInput, InstanceNames, PreemptNotice
    from contracts.ids import INSTANCE_PREEMPT, instance_id
    from contracts.group import (DEPLOYMENT_SCALE_ROLE, FORM_GROUP, PLACE_MEMBER, SCALE_IN_MEMBER, FormGroupAsk,
                                 GroupPlaced, MemberPlaced, MemberRef, PlaceMemberAsk, RoleScaleAsk, ScaleInAsk,
                                 ScaleInPick)
    from contracts.records import StartInstances
    from scheduler.autoscale.roles import autoscaling_problem
    from scheduler.groups.compat import NO_ROLL, judge
    from scheduler.groups.roles import role_spec
    from scheduler.groups.spec import RoleName
    from scheduler.groups.status import MODEL_BAD
    from scheduler.spec import ModelSpec
    from workflows import common as c
    from workflows import messages
    from workflows.group_roll import GroupRoll

RETRY_S, RETRY_CAP_S = 2.0, 30.0  # a group not formed tries again after this, doubling
VICTIMS_WAIT_S = 300  # a group formed by preemption starts its members once its victims stopped, or after this


def group_problem(spec: ModelSpec) -> str | None:
    """What a spec's autoscaling may not ask for (None: it may): a group is autoscaled per role
    (autoscaling.roles), a plain deployment never is (scheduler/autoscale/roles.py)."""
    if spec.autoscaling is not None:
        return autoscaling_problem(spec.autoscaling, [r.name.value for r in spec.roles] if spec.is_group else None)
    return None


def members_total(spec: ModelSpec) -> int:
    return sum(r.replicas for r in spec.roles or [])


def wanted_total(spec: ModelSpec) -> int:
    """The replicas a spec wants: a group's every member (0 while it is off: its own ``replicas``
    0, its roles' kept for when it is switched on), a plain deployment's ``replicas``."""
    if spec.is_group:
        return members_total(spec) if spec.replicas else 0
    return spec.replicas


def group_off(raw: dict) -> bool:
    """A group switched off: its own ``replicas`` 0 (every member stopped, the deployment kept)."""
    return bool(raw.get("roles")) and raw.get("replicas") == 0


def _without_replicas(raw: dict) -> dict:
    out = {k: v for k, v in raw.items() if k not in NO_ROLL | {"roles"}}
    out["roles"] = [{k: v for k, v in r.items() if k != "replicas"} for r in raw.get("roles") or []]
    return out


def restarts_group(old: dict, new: dict) -> bool:
    """Whether a change of a group's spec replaces any of its members (rolled role by role, whole or
    recreated: scheduler/groups/compat.py); a role's replicas and the fields that restart nothing
    never do. Specs that do not validate: any change but those."""
    try:
        return judge(ModelSpec.model_validate(old), ModelSpec.model_validate(new)).way != "none"
    except ValueError:
        return _without_replicas(old) != _without_replicas(new)


class GroupSteps(GroupRoll):
    """The deployment workflow's group half (workflows/deployment.py keeps the rest)."""

    def _group_init(self, inp: DeploymentInput) -> None:
        self.members: dict[str, str] = dict(inp.members)  # every member named (started or forming) -> role
        self.forming: list[str] = list(inp.forming)  # named for a formation not booked yet
        self.degraded: list[str] = list(inp.degraded)  # the formation's degradations (gather_unmet)
        self.waiting = ""  # why the group (or a role's new member) is not placed yet
        self.retry_s = RETRY_S

    def _group_carry(self) -> dict[str, Any]:
        return {"members": self.members, "forming": self.forming, "degraded": self.degraded}

    def _group_lines(self) -> list[str]:
        """The Temporal UI's lines of a group: each role's members started of those wanted, why
        it waits, its degradations."""
        roles = self.raw.get("roles") or []
        if not roles:
            return []
        have = [r for n, r in self.members.items() if n in self.instances]
        out = [", ".join(f"{r.get('name')} {have.count(r.get('name'))}/{r.get('replicas', 1)}" for r in roles)]
        if self.waiting:
            out.append(f"**waiting** {self.waiting[:500]}")
        if self.degraded:
            out.append(f"**degraded** {', '.join(self.degraded)}")
        if self.ro.rolling and self.ro.why:
            out.append(f"**rolling** {self.ro.why[:500]}")
        return out

    def _wait_s(self, default: timedelta) -> timedelta:
        """The loop's wait: shorter while a group waits to be placed (its retry)."""
        return min(default, c.secs(self.retry_s)) if self.waiting else default

    @workflow.update(name=DEPLOYMENT_SCALE_ROLE)
    async def scale_role(self, *args: Any) -> Any:
        """One role's replicas (a RoleScaleAsk): that role's members added or stopped, no other
        member touched; answers once the member to add or stop is chosen."""
        ask = messages.one(args, RoleScaleAsk, DEPLOYMENT_SCALE_ROLE)
        raw = dict(self.raw)
        raw["roles"] = [{**r, "replicas": ask.replicas} if r.get("name") == ask.role.value else r
                        for r in raw.get("roles") or []]
        spec = ModelSpec.model_validate(raw)
        await self._within_limits(wanted_total(spec))
        self.raw, self.replicas, self.dirty = raw, wanted_total(spec), True
        return await self._applied()

    @scale_role.validator
    def _check_scale_role(self, *args: Any) -> None:
        ask = messages.one(args, RoleScaleAsk, DEPLOYMENT_SCALE_ROLE)
        spec = ModelSpec.model_validate(self.raw)
        if not spec.is_group:
            raise ValueError(f"deployment {self.name} has no roles: scale it with gpuflow scale NAME N")
        if ask.role.value not in {r.name.value for r in spec.roles}:
            raise ValueError(f"deployment {self.name} has no role {ask.role.value} "
                             f"(its roles: {', '.join(r.name.value for r in spec.roles)})")
        raw = dict(self.raw)
        raw["roles"] = [{**r, "replicas": ask.replicas} if r.get("name") == ask.role.value else r
                        for r in raw.get("roles") or []]
        try:
            ModelSpec.model_validate(raw)
        except ValueError as e:
            raise ValueError(f"scale_role: {str(e)[:500]}") from None
        if self.deleting:
            raise ValueError(f"deployment {self.name} is being deleted")

    # --- the loop's step --------------------------------------------------------------------------
    async def _group_off_step(self, spec: ModelSpec) -> None:
        """A group switched off (its ``replicas`` 0): every member stopped (its workflow releases its
        booking), those named for a formation forgotten; switched on, the step forms it whole again."""
        await self._stop(list(self.instances))
        await self._forget(list(self.forming))
        self.waiting, self.retry_s, self.degraded = "", RETRY_S, []
        r = self.ro
        if r.rolling and not self.instances and not self.stopping and not self.forming:  # off mid-roll: nothing rolls
            self._roll_done(f"the group is off: no member runs version {r.from_version}; version {r.version} "
                            "forms whole when it is switched on")

    async def _group_step(self, spec: ModelSpec) -> None:
        keep = set(self.instances) | set(self.forming) | set(self.stopping)
        self.members = {n: r for n, r in self.members.items() if n in keep}
        if not self.instances:
            if not self.stopping:  # a restarted group forms once its old members are gone
                await self._form(spec)
            return
        for r in spec.roles:
            have = [n for n in self.instances if self.members.get(n) == r.name.value]
            asked = [n for n in self.forming if self.members.get(n) == r.name.value]
            if len(have) >= r.replicas and asked:  # scaled back before its new member was placed
                await self._forget(asked)
            if len(have) < r.replicas:
                await self._add_member(spec, r.name, asked[0] if asked else None)
                return
            if len(have) > r.replicas:
                pick: ScaleInPick = await workflow.execute_activity(
                    SCALE_IN_MEMBER, ScaleInAsk(deployment=self.name, spec=self.raw, role=r.name, live=have),
                    result_type=ScaleInPick, **c.STORE_CALL)
                await self._stop([pick.victim or have[-1]])
                self.dirty = True  # one at a time: the loop comes back for the next
                return
        self.waiting, self.retry_s = "", RETRY_S

    def _named(self, role: str) -> str:
        """A new member's name; it runs the current version, in the current generation."""
        name = f"{self.name}-{self.next_index}"
        self.next_index += 1
        self.forming.append(name)
        self.members[name] = role
        self.ro.versions[name], self.ro.gens[name] = self.ro.version, self.ro.gen
        return name

    async def _form(self, spec: ModelSpec) -> None:
        want = sorted(r.name.value for r in spec.roles for _ in range(r.replicas))
        if sorted(self.members.get(n, "") for n in self.forming) != want:  # named for another shape
            await self._forget(list(self.forming))
        if not self.forming:
            for r in spec.roles:
                for _ in range(r.replicas):
                    self._named(r.name.value)
        got: GroupPlaced = await workflow.execute_activity(
            FORM_GROUP, FormGroupAsk(deployment=self.name, spec=self.raw, gen=self.ro.gen, members=[
                MemberRef(name=n, role=RoleName(self.members[n])) for n in self.forming]),
            result_type=GroupPlaced, **c.STORE_CALL)
        await self._placed(spec, got)

    async def _add_member(self, spec: ModelSpec, role: RoleName, name: str | None) -> str:
        """One more ``role`` member, placed alone; ``name``: the one asked for before, still waiting.
        Returns its name (placed, or still waiting: then ``waiting`` says why)."""
        name = name or self._named(role.value)
        got: GroupPlaced = await workflow.execute_activity(
            PLACE_MEMBER, PlaceMemberAsk(deployment=self.name, spec=self.raw, member=MemberRef(name=name, role=role),
                                         gen=self.ro.gens.get(name, self.ro.gen)), result_type=GroupPlaced, **c.STORE_CALL)
        await self._placed(spec, got)
        return name

    async def _placed(self, spec: ModelSpec, got: GroupPlaced) -> None:
        """Start every booked member's workflow with its booking; or say why none is placed."""
        if not got.scheduled:  # its model cannot be estimated (members ERROR), a quota, or no room
            why = got.why if got.why.startswith(("quota:", MODEL_BAD)) else f"unschedulable: {got.why}"
            self.retry_s = min(RETRY_CAP_S, self.retry_s * 2) if self.waiting else RETRY_S
            if why.startswith(MODEL_BAD):  # the spec's fault: looked at again rarely (a fixed file is seen)
                self.retry_s = RETRY_CAP_S
            self.waiting = why
            return
        await self._victims_stopped(got)
        await workflow.execute_activity(c.START_INSTANCES, StartInstances(instances=[
            self._member_input(spec, m) for m in got.members]), **c.STORE_CALL)
        started = {m.name for m in got.members}
        if len(got.members) > 1 or not self.instances:  # a formation: its degradations are the group's
            self.degraded = list(got.degradations)
        self.instances.extend(m.name for m in got.members)
        self.forming = [n for n in self.forming if n not in started]
        self.waiting, self.retry_s = "", RETRY_S

    async def _victims_stopped(self, got: GroupPlaced) -> None:
        """A group booked by preemption: each victim is told who took its GPUs, and no member starts
        until none of them still runs (victims_left), or VICTIMS_WAIT_S passed."""
        if not got.victims:
            return
        notice = PreemptNotice(by=f"{got.tenant}/{self.name}", instance=got.members[0].name, why=got.preempt_why)
        for v in got.victims:
            try:
                await workflow.get_external_workflow_handle(instance_id(v)).signal(INSTANCE_PREEMPT, notice)
            except Exception:  # noqa: BLE001  already gone: nothing of it runs
                pass
        for _ in range(VICTIMS_WAIT_S):
            left: InstanceNames = await workflow.execute_activity(
                c.VICTIMS_LEFT, InstanceNames(names=got.victims), result_type=InstanceNames, **c.STORE_CALL)
            if not left.names:
                return
            await workflow.sleep(1)

    def _member_input(self, spec: ModelSpec, m: MemberPlaced) -> InstanceInput:
        rspec = role_spec(spec, m.role).model_dump(mode="json", exclude_none=True)
        return InstanceInput(name=m.name, deployment=self.name, spec=rspec, timings=self.timings, placement=m.plan,
                             decision=m.decision, group=self.name, role=m.role.value,
                             pd_mode=spec.disaggregation.mode.value if spec.disaggregation else None)

    async def _forget(self, names: list[str]) -> None:
        """Members named but never started (no workflow): forgotten here, their rows recorded
        deleted (closed_workflows), nothing held."""
        if not names:
            return
        self.forming = [n for n in self.forming if n not in names]
        for n in names:
            self.members.pop(n, None)
        self.waiting = ""
        await workflow.execute_activity(c.CLOSED_WORKFLOWS, InstanceNames(names=names),
                                        result_type=ClosedInstances, **c.STORE_CALL)
