"""ModelDeploymentWorkflow (id ``deployment/<name>``): holds a model's spec and keeps its
replicas. Updates: ``scale``, ``update_spec`` (a changed spec rolls the replicas: workflows/rollout_steps.py),
``rollout_undo``, ``delete``, each input one model validated as it arrives (contracts/deployment.py;
workflows/messages.py). Scale-down asks the rank activity for the cluster-wide removal order (ERROR and
unreachable before healthy RUNNING) and stops the lowest first. Instances whose workflows end
on their own are replaced. Continue-as-new keeps the history bounded."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from contracts.ids import DEPLOYMENT_ACCEPTED, DEPLOYMENT_DELETE, DEPLOYMENT_INSTANCE_ENDED, DEPLOYMENT_ROLLOUT, DEPLOYMENT_ROLLOUT_UNDO, DEPLOYMENT_SCALE, DEPLOYMENT_STATUS, DEPLOYMENT_UPDATE_SPEC, DEPLOYMENT_WORKFLOW, INSTANCE_STOP, deployment_id, instance_id
    from contracts.autoscale import START_AUTOSCALER, DeploymentRef
    from contracts.control import (ClosedInstances, DeploymentInput, DeploymentView, InstanceInput, InstanceNames,
                                   ScaleDownOrder, Timings, host_queue)
    from contracts.deployment import InstanceEnded, ScaleAsk
    from contracts.placement import ScaleDownAsk
    from contracts.queue import TenantAsk
    from contracts.records import SaveDeployment, StartInstances
    from contracts.rollout import RolloutView
    from scheduler.rollout import DONE, ROLLBACK, START, STOP
    from contracts import agent as hp, ui_text
    from contracts.limits import ClusterPolicy, Limits, cluster_timings
    from scheduler.spec import ModelSpec
    from workflows import common as c
    from workflows import guards, messages, signals
    from workflows import rollout_steps as ro
    from workflows.group_steps import GroupSteps, group_off, group_problem, wanted_total
    from workflows.pd_watch import PDWatch
    from workflows.inputs import one_input


START_BATCH = 64


def parse_spec(raw: dict) -> ModelSpec:
    try:
        spec = ModelSpec.model_validate(raw)
    except ValidationError as e:
        raise ValueError(f"invalid model spec: {e}") from None
    if group_problem(spec):
        raise ValueError(group_problem(spec))
    return spec


@workflow.defn(name=DEPLOYMENT_WORKFLOW)
class ModelDeploymentWorkflow(GroupSteps, PDWatch):
    @workflow.init
    def __init__(self, *args: Any) -> None:
        inp = one_input(args, DeploymentInput, "ModelDeploymentWorkflow")
        self.raw = dict(inp.spec)
        self.replicas = inp.replicas
        self.base_timings = inp.timings or Timings()  # the input's; the cluster's replace them (``timings``)
        self.instances: list[str] = list(inp.instances)
        self.stopping: set[str] = set()
        self.next_index = inp.next_index
        self.deleting = inp.deleting
        self.ended: set[str] = set()
        self.dirty = True
        self.recreate = False
        self.asked = 0  # updates answered once the loop has applied them (asked <= applied)
        self.applied = 0
        self.limits: Limits | None = None  # the operator's, read by an activity when run starts
        self.fresh = not inp.instances and inp.next_index == 0
        self.ro = ro.state_from(inp.rollout)  # workflows/rollout_steps.py
        ro.begin(self.ro, self.raw)  # the versions kept for `gpuflow rollout undo`
        self.checked = False  # the spec passed the control plane's checks (limits, tenant)
        self._group_init(inp)  # a prefill/decode group's members (workflows/group_steps.py)
        self._pd_init()  # its disaggregation's watch: pd_ineffective (workflows/pd_watch.py)

    @property
    def timings(self) -> Timings:
        """The cluster's, with the spec's per-deployment ones (contracts/limits.py ClusterPolicy)."""
        return cluster_timings(self.limits, self.base_timings, self.raw)

    @property
    def name(self) -> str:
        return str(self.raw.get("name", ""))

    # --- messages -------------------------------------------------------------------------------
    @workflow.query(name=DEPLOYMENT_STATUS)
    def status(self) -> DeploymentView:
        return DeploymentView(name=self.name, replicas=self.replicas or 0, instances=list(self.instances),
                              deleting=self.deleting, spec=self.raw, stopping=sorted(self.stopping),
                              members=self.members, forming=self.forming, waiting=self.waiting,
                              degraded=self.degraded + self.pd_degraded,
                              degraded_why={k: self.pd_why for k in self.pd_degraded if self.pd_why})

    @workflow.update(name=DEPLOYMENT_ACCEPTED)
    async def accepted(self, *args: Any) -> DeploymentView:
        """Answers once the control plane's checks passed (``gpuflow deploy`` waits on it); a spec
        they refuse fails the workflow instead, with the reason. Takes no input."""
        await workflow.wait_condition(lambda: self.checked)
        return self.status()

    @accepted.validator
    def _check_accepted(self, *args: Any) -> None:
        messages.none(args, "accepted")

    @workflow.query(name=DEPLOYMENT_ROLLOUT)
    def rollout(self) -> RolloutView:
        return ro.view(self.ro, self.name, self.replicas or 0, self.instances, self.stopping)

    async def _applied(self) -> DeploymentView:
        self.asked += 1
        mine = self.asked
        await workflow.wait_condition(lambda: self.applied >= mine)
        return self.status()

    async def _within_limits(self, replicas: int) -> None:
        """An update over the operator's maximum fails (the deployment carries on as it was)."""
        await workflow.wait_condition(lambda: self.limits is not None)
        problem = self.limits.replicas_problem(replicas)
        if problem:
            raise ApplicationError(problem, type="InvalidSpec", non_retryable=True)

    @workflow.update(name=DEPLOYMENT_SCALE)
    async def scale(self, *args: Any) -> DeploymentView:
        """Set the replica count (a ScaleAsk, or a bare whole number); answers once the instances to
        add or stop are chosen."""
        ask = messages.one(args, ScaleAsk, DEPLOYMENT_SCALE)  # the validator let only this in
        if self.raw.get("roles"):  # a group: 0 switches it off, 1 on (its roles' replicas kept)
            raw = {**self.raw, "replicas": ask.replicas}
            await self._within_limits(wanted_total(parse_spec(raw)))
            self.raw, self.replicas, self.dirty = raw, wanted_total(parse_spec(raw)), True
            return await self._applied()
        await self._within_limits(ask.replicas)
        self.replicas, self.dirty = ask.replicas, True
        return await self._applied()

    @scale.validator
    def _check_scale(self, *args: Any) -> None:
        replicas = messages.one(args, ScaleAsk, DEPLOYMENT_SCALE).replicas
        problem = self.limits.replicas_problem(replicas) if self.limits else None
        if problem:
            raise ValueError(problem)
        if self.deleting:
            raise ValueError(f"deployment {self.name} is being deleted")
        if self.raw.get("roles") and replicas not in (0, 1):
            raise ValueError(f"deployment {self.name} is a prefill/decode group: scale one role (--role ROLE), "
                             "or switch it off (0) or on (1)")

    async def _known_tenant(self, spec: ModelSpec) -> None:
        """A spec naming a tenant the tenants file does not define is refused (InvalidSpec)."""
        problem = await workflow.execute_activity(c.TENANT_PROBLEM, TenantAsk(tenant=spec.tenant),
                                                  result_type=str | None, **c.STORE_CALL)
        if problem:
            raise ApplicationError(problem, type="InvalidSpec", non_retryable=True)

    @workflow.update(name=DEPLOYMENT_UPDATE_SPEC)
    async def update_spec(self, *args: Any) -> DeploymentView:
        """Make this the deployment's spec (one model spec, as written): a change outside the fields
        that restart nothing rolls the replicas (workflows/rollout_steps.py)."""
        new = messages.one(args, ModelSpec, "update_spec", "model spec")  # the validator let only this in
        return await self._change_spec(args[0] if isinstance(args[0], dict) else new.model_dump(mode="json",
                                                                                                exclude_none=True))

    async def _change_spec(self, spec: dict, undo: tuple[ro.Outcome, str] | None = None) -> DeploymentView:
        new = parse_spec(spec)
        replicas = wanted_total(new)  # a group's: its members, every role's together (0 while off)
        await self._within_limits(replicas)
        if new.tenant != parse_spec(self.raw).tenant:
            await self._known_tenant(new)
        change = ro.change_spec(self.ro, self.raw, dict(spec), new, parse_spec(self.raw), undo)  # a group's: compat
        self.raw, self.recreate = change.raw, self.recreate or change.recreate
        self.dirty, self.replicas = True, replicas
        return await self._applied()

    @workflow.update(name=DEPLOYMENT_ROLLOUT_UNDO)
    async def rollout_undo(self, *args: Any) -> DeploymentView:
        """Back to the last good spec before the current one, never one rolled back for failing
        (rollout_steps.undo_choice), rolled the same way; the replica count stays."""
        to, said = ro.undo_choice(self.ro)
        if to is None:  # refused by the validator; here only if the state changed since
            raise ApplicationError(f"deployment {self.name}: nothing to undo to: {said}", type="InvalidSpec",
                                   non_retryable=True)
        return await self._change_spec(ro.undo_raw(to, self.raw, self.replicas or 0), (to, said))

    @rollout_undo.validator
    def _check_undo(self, *args: Any) -> None:
        messages.none(args, "rollout_undo")
        to, said = ro.undo_choice(self.ro)
        if to is None:
            raise ValueError(f"deployment {self.name}: nothing to undo to: {said}")
        self._check_new(parse_spec(to.raw()))

    @update_spec.validator
    def _check_spec(self, *args: Any) -> None:
        self._check_new(messages.one(args, ModelSpec, "update_spec", "model spec"))

    def _check_new(self, new: ModelSpec) -> None:
        if group_problem(new):
            raise ValueError(group_problem(new))
        if new.name != self.name:
            raise ValueError(f"spec name {new.name!r} does not match deployment {self.name!r}")
        if self.deleting:
            raise ValueError(f"deployment {self.name} is being deleted")

    @workflow.update(name=DEPLOYMENT_DELETE)
    async def delete(self, *args: Any) -> DeploymentView:
        """Stop every replica and end; answers at once. Takes no input."""
        self.deleting, self.dirty = True, True
        return self.status()

    @delete.validator
    def _check_delete(self, *args: Any) -> None:
        messages.none(args, "delete")

    @workflow.signal(name=DEPLOYMENT_INSTANCE_ENDED)
    def instance_ended(self, *args: Any) -> None:
        """From a replica's workflow as it ends (untrusted: an InstanceEnded naming one of this
        deployment's replicas, ``<deployment>-<n>``; anything else is refused, logged and counted:
        workflows/signals.py)."""
        ended = signals.one(args, InstanceEnded, DEPLOYMENT_INSTANCE_ENDED)
        if ended is not None and signals.check(DEPLOYMENT_INSTANCE_ENDED, signals.of_deployment(ended.instance, self.name),
                                               f"{ended.instance} is not a replica of deployment {self.name}"):
            self.ended.add(ended.instance)

    # --- reconciliation -------------------------------------------------------------------------
    @workflow.run
    async def run(self, *args: Any) -> DeploymentView:
        try:
            spec = parse_spec(self.raw)
        except ValueError as e:
            raise ApplicationError(str(e), type="InvalidSpec", non_retryable=True) from None
        guards.workflow_id(deployment_id(spec.name), f"spec name {spec.name!r}")
        guards.instance_names(spec.name, self.instances)
        if self.replicas is None or spec.is_group:
            self.replicas = wanted_total(spec)
        if self.replicas < 0:
            raise ApplicationError(f"replicas must be >= 0, got {self.replicas}", type="InvalidSpec", non_retryable=True)
        self.limits = await workflow.execute_activity(c.DEPLOYMENT_LIMITS, result_type=ClusterPolicy, **c.STORE_CALL)
        problem = self.limits.replicas_problem(self.replicas)
        if problem and self.fresh:  # a new deployment over the maximum: refused whole, nothing started
            raise ApplicationError(problem, type="InvalidSpec", non_retryable=True)
        if self.fresh:  # a typo in the tenant: refused, nothing started
            await self._known_tenant(spec)
        self.checked = True
        workflow.upsert_search_attributes([c.SA_MODEL.value_set(spec.name), c.SA_DEPLOYMENT.value_set(spec.name),
                                           c.SA_STATE.value_set("DELETING" if self.deleting else "ACTIVE")])
        saved = None
        while True:
            try:
                await workflow.wait_condition(
                    lambda: self.dirty or bool(self.ended) or self._may_continue_as_new(),
                    timeout=self._pd_wait(self._wait_s(ro.timeout(self.ro, self.timings.reconcile_s))))
            except asyncio.TimeoutError:
                await self._drop_closed()
            self.dirty = False
            target = self.asked
            self._absorb_ended()
            state = "deleting" if self.deleting else "active"
            self._show(state)
            now = (state, self.replicas, tuple(sorted(self.raw.items(), key=str)))
            if saved != now:
                saved = now
                workflow.upsert_search_attributes([c.SA_STATE.value_set(state.upper())])
                await workflow.execute_activity(c.SAVE_DEPLOYMENT, SaveDeployment(name=self.name, spec=self.raw,
                                                                                  replicas=self.replicas, state=state),
                                                **c.STORE_CALL)
                if self.raw.get("autoscaling") is not None and not self.deleting:
                    await workflow.execute_activity(START_AUTOSCALER, DeploymentRef(deployment=self.name),
                                                    **c.STORE_CALL)
            if self.deleting:
                self.applied = max(self.applied, target)  # nothing left to scale: answer waiting updates
                await self._stop(list(self.instances))
                await self._forget(list(self.forming))
                if not self.stopping:
                    await workflow.execute_activity(c.SAVE_DEPLOYMENT, SaveDeployment(
                        name=self.name, spec=self.raw, replicas=0, state="deleted"), **c.STORE_CALL)
                    workflow.upsert_search_attributes([c.SA_STATE.value_set("DELETED")])
                    return self.status()
                continue
            if self.recreate:
                self.recreate = False
                await self._stop(list(self.instances))
                await self._forget(list(self.forming))
            if self.raw.get("roles"):  # a group's: off, a roll (workflows/group_roll.py), else each role kept
                await (self._group_off_step if group_off(self.raw) else self._group_roll_step if self.ro.rolling
                       else self._group_step)(parse_spec(self.raw))
                await self._pd_check()  # pd_ineffective, at most every 15 s (workflows/pd_watch.py)
            elif self.ro.rolling:
                await self._rollout_step()
            else:
                await self._scale_up()
                await self._scale_down()
            self.applied = max(self.applied, target)
            self._show(state)
            if self._may_continue_as_new():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(DeploymentInput(
                    spec=self.raw, replicas=self.replicas, timings=self.timings, instances=self.instances,
                    next_index=self.next_index, deleting=self.deleting, rollout=self.ro, **self._group_carry()))

    def _show(self, state: str) -> None:
        """Its current details in the Temporal UI (contracts/ui_text.py)."""
        workflow.set_current_details(ui_text.deployment_current(state, self.raw, self.replicas or 0,
                                                                len(self.instances), self.ro.rolling,
                                                                self._group_lines() + self._pd_lines()))

    async def _rollout_step(self) -> None:
        """One step of the running rollout: look at the replicas, let the rollout decide
        (workflows/rollout_steps.py ``decide``), and do what it says."""
        now = workflow.now().timestamp()
        probes, counts = await ro.look(self.ro, self.raw, self.name, self.instances)  # the replicas; the gateways'
        s = ro.decide(self.ro, self.raw, self.replicas or 0, self.instances, probes, now, counts=counts)
        if s.action == START:
            ro.log_step(self.ro, START, await self._start_new(s.count), s.reason)
        elif s.action == STOP:
            ro.log_step(self.ro, STOP, s.names, s.reason, s.fallback)
            await self._stop(s.names)
        elif s.action == DONE:
            ro.done(self.ro, s.reason, set(self.instances) | set(self.stopping))
        elif s.action == ROLLBACK:
            good = ro.roll_back(self.ro, s.reason)
            if good is not None:  # back to the last good spec: the loop applies it
                self.raw, self.dirty = good, True
        else:  # WAIT, or BAKE: the last step taken, the version on probation
            ro.log_step(self.ro, s.action, [], s.reason)

    def _may_continue_as_new(self) -> bool:
        """Suggested by the server, and nothing in flight: instances being stopped still owe us
        their instance_ended signal, and waiting on it must not spin the loop."""
        return workflow.info().is_continue_as_new_suggested() and not self.stopping

    def _absorb_ended(self) -> None:
        for name in sorted(self.ended):
            self.stopping.discard(name)
            if name in self.instances:  # ended without being asked: replace it
                self.instances.remove(name)
                self.dirty = True
        self.ended.clear()

    async def _drop_closed(self) -> None:
        names = self.instances + sorted(self.stopping)
        if not names:
            return
        closed: ClosedInstances = await workflow.execute_activity(
            c.CLOSED_WORKFLOWS, InstanceNames(names=names), result_type=ClosedInstances, **c.STORE_CALL)
        for gone in closed.closed:
            self.ended.add(gone.name)
            for host in gone.hosts or ([gone.worker] if gone.worker else []):
                try:  # it ended without stopping its processes: stop them, where the host answers
                    await workflow.execute_activity(
                        hp.STOP_INSTANCE, gone.name, task_queue=host_queue(host),
                        schedule_to_start_timeout=c.secs(self.timings.host_schedule_to_start_s),
                        start_to_close_timeout=c.secs(120), retry_policy=RetryPolicy(maximum_attempts=1))
                except ActivityError:
                    pass

    async def _scale_up(self) -> None:
        missing = (self.replicas or 0) - len(self.instances)
        if missing > 0:
            await self._start_new(missing)

    async def _start_new(self, missing: int) -> list[str]:
        new = []
        for _ in range(missing):
            new.append(f"{self.name}-{self.next_index}")
            self.next_index += 1
        for i in range(0, len(new), START_BATCH):  # a few at a time: every input carries the spec
            batch = new[i:i + START_BATCH]
            await workflow.execute_activity(
                c.START_INSTANCES,
                StartInstances(instances=[InstanceInput(name=n, deployment=self.name, spec=self.raw, timings=self.timings)
                                          for n in batch]),
                **c.STORE_CALL)
            self.instances.extend(batch)
            self.ro.versions.update({n: self.ro.version for n in batch if self.ro.version})
        return new

    async def _scale_down(self) -> None:
        excess = len(self.instances) - (self.replicas or 0)
        if excess <= 0:
            return
        spec = parse_spec(self.raw)
        order: ScaleDownOrder = await workflow.execute_activity(
            c.RANK_SCALE_DOWN, ScaleDownAsk(model=spec.name, strategy=spec.placement_strategy, live=self.instances),
            result_type=ScaleDownOrder, **c.STORE_CALL)
        await self._stop(order.order[:excess])

    async def _stop(self, names: list[str]) -> None:
        for n in names:
            if n in self.instances:
                self.instances.remove(n)
            if n in self.stopping:
                continue
            self.stopping.add(n)
            try:
                await workflow.get_external_workflow_handle(instance_id(n)).signal(INSTANCE_STOP)
            except Exception:  # noqa: BLE001  already gone: nothing to stop
                self.stopping.discard(n)
