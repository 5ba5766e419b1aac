"""The group activities (issue 41, task queue ``gpuflow-control``), each called by the deployment
workflow of the group it names (activities/callers.py):

- ``form_group``: the members' rows written (wanted, PENDING, each with its role: store/groups.py),
  then the whole group decided and booked in one transaction, or nothing (activities/group_place.py);
  not formed, the members' rows say why, naming the role that does not fit;
- ``place_member``: one more member of a formed group's role, placed alone (scale_out) and booked;
- ``scale_in_member``: the member a role's scale-in removes (scale_in: the retention scorer's victim).
Each role's request is its effective spec's (role_spec), costed as the place activity costs a spec;
the router's is its RAM (router_ram), no GPU."""

from __future__ import annotations

from typing import Awaitable, Callable

from sqlalchemy.engine import Engine
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import callers, tenancy
from activities.decider import Decider
from activities.estimate_cache import EstimateCache
from activities.group_place import book, formation, one_more
from activities.placement import valid_spec
from activities.runner import Runner
from contracts.group import (FORM_GROUP, PLACE_MEMBER, SCALE_IN_MEMBER, FormGroupAsk, GroupPlaced, PlaceMemberAsk,
                             ScaleInAsk, ScaleInPick)
from scheduler.errors import GpuflowError
from scheduler.groups.roles import role_spec
from scheduler.groups.scale_in import scale_in
from scheduler.groups.spec import RoleName, router_ram
from scheduler.groups.status import MODEL_BAD
from scheduler.request import FlatRequest, Request
from scheduler.spec import ModelSpec
from store import groups, ledger


def group_spec(raw: dict, deployment: str) -> ModelSpec:
    spec = valid_spec(raw)
    if not spec.is_group or spec.name != deployment:
        raise ApplicationError(f"{deployment}: not a prefill/decode group's spec of this deployment", type="InvalidInput",
                               non_retryable=True)
    return spec


class GroupActivities:
    def __init__(self, engine: Engine, runner: Runner, estimates: EstimateCache, decider: Decider,
                 wake: Callable[..., Awaitable[int]]):
        self.engine, self.runner, self.estimates, self.decider, self.wake = engine, runner, estimates, decider, wake

    def all(self) -> list:
        return [self.form_group, self.place_member, self.scale_in_member]

    async def _request(self, spec: ModelSpec, role: RoleName) -> Request | str:
        """A role's request, or why its model cannot be estimated (the spec's fault: a str)."""
        if role == RoleName.ROUTER:
            return FlatRequest(vram=0, ram=router_ram(spec.roles), basis="the router's RAM (it loads no weights)")
        try:
            return await self.runner.run(self.estimates.get, role_spec(spec, role), None)
        except GpuflowError as e:
            return str(e)

    async def _model_bad(self, names: list[str], bad: dict[RoleName, str]) -> GroupPlaced:
        """Not formed, for the spec's fault (``bad``: role -> why its model cannot be estimated): the
        members ERROR saying why (never a failed activity, which failed the deployment's workflow; a
        plain replica gives up the same way). Roles failing alike are named together."""
        by_why: dict[str, list[str]] = {}
        for role, why in bad.items():
            by_why.setdefault(why, []).append(role.value)
        why = f"{MODEL_BAD}: " + "; ".join(f"role {', '.join(rs)}: {w}" for w, rs in by_why.items())
        await self.runner.run(groups.set_failed, self.engine, names, why)
        return GroupPlaced(scheduled=False, reasons=[why[:2000]])

    async def _book(self, spec: ModelSpec, group: str, choose, names: list[str]) -> GroupPlaced:
        who = await self.runner.run(tenancy.owners_of, self.decider.reads, spec)
        try:
            got = await self.runner.run(book, self.decider, spec, group, choose, who)
        except ledger.NotWanted as e:
            raise ApplicationError(str(e), type="NotWanted", non_retryable=True) from None
        if got.scheduled:
            await self.wake(taken=True)
        else:
            await self.runner.run(groups.set_waiting, self.engine, names, got.why)
        return got

    @activity.defn(name=FORM_GROUP)
    async def form_group(self, ask: FormGroupAsk) -> GroupPlaced:
        """Write the members' rows, decide the group whole and book it in one transaction, or nothing."""
        callers.check(FORM_GROUP, ask)
        spec = group_spec(ask.spec, ask.deployment)
        want = {r.name: r.replicas for r in spec.roles}
        names: dict[RoleName, list[str]] = {}
        for m in ask.members:
            names.setdefault(m.role, []).append(m.name)
        if {r: len(n) for r, n in names.items()} != want:
            raise ApplicationError(f"{ask.deployment}: the members asked for do not match the roles' replicas",
                                   type="InvalidInput", non_retryable=True)
        await self.runner.run(groups.create_members, self.engine, ask.deployment, spec.name,
                              {m.name: m.role.value for m in ask.members}, ask.gen)
        requests = {r: await self._request(spec, r) for r in names}
        bad = {r: x for r, x in requests.items() if isinstance(x, str)}
        if bad:
            return await self._model_bad([m.name for m in ask.members], bad)
        return await self._book(spec, ask.deployment, formation(spec, names, requests, self.decider.policy),
                                [m.name for m in ask.members])

    @activity.defn(name=PLACE_MEMBER)
    async def place_member(self, ask: PlaceMemberAsk) -> GroupPlaced:
        """One more member of a formed group's role, placed alone and booked (or why not)."""
        callers.check(PLACE_MEMBER, ask)
        spec = group_spec(ask.spec, ask.deployment)
        m = ask.member
        await self.runner.run(groups.create_members, self.engine, ask.deployment, spec.name, {m.name: m.role.value},
                              ask.gen)
        req = await self._request(spec, m.role)
        if isinstance(req, str):
            return await self._model_bad([m.name], {m.role: req})
        return await self._book(spec, ask.deployment,
                                one_more(spec, ask.deployment, m.name, m.role, req, self.decider.policy), [m.name])

    @activity.defn(name=SCALE_IN_MEMBER)
    async def scale_in_member(self, ask: ScaleInAsk) -> ScaleInPick:
        """The member of ``ask.role`` a scale-in removes, among ``ask.live``: one not placed yet
        first, else the retention scorer's victim (scheduler/groups/scale_in.py)."""
        spec = group_spec(ask.spec, ask.deployment)
        snap = (await self.runner.run(self.decider.snapshots.refresh, self.engine))[0]
        placed = {i.name for i in snap.instances if i.worker is not None}
        waiting = [n for n in ask.live if n not in placed]
        if waiting:
            return ScaleInPick(victim=waiting[-1], reasons=[f"{waiting[-1]} is not placed yet"])
        choice = await self.runner.run(scale_in, snap, spec, ask.role, ask.deployment, self.decider.policy)
        return ScaleInPick(victim=choice.victim if choice.victim in ask.live else None, reasons=choice.reasons)
