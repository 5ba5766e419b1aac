"""The autoscaler's step for a prefill/decode group (issue 35): each role scaled on its own signals,
the I/O around the pure scheduler/autoscale/roles.py.

1. The group's RUNNING members (store/serving.py ``group_members``: ``routes()`` leaves them out)
   and every live gateway are scraped as for a plain deployment (activities/autoscale.py).
2. Each autoscaled role gets its own sample: its members' engine windows (TTFT on a prefill, ITL
   and ``vllm:kv_cache_usage_perc`` on a decode), and of the gateways' role-blind view what
   measures that role (``role_gateway``). Samples and policy state are carried per role.
3. ``decide_roles`` decides each role on its own history and state, with the workflow's ``now``;
   each role's step that did something or voted is kept (kind ``autoscale``, with its role) and
   replays like any autoscaler step (``gpuflow explain NAME --replay``).
4. A role that scales up asks the scheduler first: one more member of that role placed alone
   beside the group (scheduler/autoscale/fit.py ``fit_member``, the dry run of ``place_member``).
   Only what fits is added; a role that does not fit is capacity-blocked with the scheduler's
   reasons (and the capacity hook hears its demand), and the other role's step goes on regardless.

The workflow sets each role's absolute count through the deployment's ``scale_role`` update
(contracts/group.py RoleScaleAsk): the other role's members are not touched."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from activities import capacity_hook
from contracts.autoscale import RoleStep, Step
from contracts.control import DeploymentView
from contracts.group import DEPLOYMENT_SCALE_ROLE, RoleScaleAsk
from contracts.ids import deployment_id
from scheduler.autoscale import kept
from scheduler.autoscale.config import keep_s
from scheduler.autoscale.fit import demand, fit_member
from scheduler.autoscale.policy import UP, Decision, PolicyState, unstepped
from scheduler.autoscale.roles import ROLES, autoscaling_problem, decide_roles, role_config, role_gateway
from scheduler.autoscale.signals import Sample, combine
from scheduler.groups.roles import role_spec
from scheduler.groups.spec import RoleName
from scheduler.spec import ModelSpec
from store import serving
from store.snapshot import load_snapshot


class GroupAutoscale:
    """AutoscaleActivities' group half (it brings engine, runner, client, keeper, estimates,
    policy, hook, metrics and ``_signals``)."""

    async def group_step(self, deployment: str, spec: ModelSpec, view: DeploymentView, carry, now: float) -> Step:
        cfg = spec.autoscaling
        wanted = {r.name.value: r.replicas for r in spec.roles}
        why = autoscaling_problem(cfg, list(wanted))
        if why:
            return Step(done=f"its autoscaling block does not fit the group: {why}")
        members = (await self.runner.run(serving.group_members, self.engine)).get(deployment)
        running = [r for r in (members.routes if members else ()) if r.instance in view.instances]
        got = await self._signals(deployment, running, carry)
        carry.scrapes = got.scrapes
        current, starting, samples = {}, {}, {}
        for role in ROLES:
            if role not in cfg.roles or role not in wanted:
                continue
            mine = [r for r in running if r.role == role]
            samples[role] = combine(now, len(mine), [got.engines[r.instance] for r in mine],
                                    role_gateway(role, got.gateway))
            carry.role_samples[role] = carry.role_samples.get(role, []) + [samples[role]]
            current[role], starting[role] = wanted[role], max(0, wanted[role] - len(mine))
        carry.keep(now, max([keep_s(role_config(cfg, r)) for r in current] or [cfg.interval_s]))
        before = dict(carry.role_policy)
        steps, dry = [], {}  # dry: the snapshot with the members an earlier role's dry run placed booked
        for role, (d, state) in decide_roles(cfg, carry.role_samples, current, starting, now, before).items():
            carry.role_policy[role] = state
            steps.append(await self._role_step(deployment, spec, role, d, samples[role],
                                               before.get(role, PolicyState()), carry, now, dry))
        total = sum(wanted.values())
        record = {"at": now, "gateways": len(got.gateways), "engines_scraped": got.scraped}
        return Step(carry=carry.out(), record=record, current=total, target=total,
                    blocked=any(s.blocked for s in steps), reasons=[x for s in steps for x in s.reasons][:50],
                    interval_s=cfg.interval_s, roles=steps)

    async def _role_step(self, deployment: str, spec: ModelSpec, role: str, d: Decision, sample: Sample,
                         before: PolicyState, carry, now: float, dry: dict) -> RoleStep:
        if self.keeper is not None and kept.worth_keeping(d):  # replayable, like a plain step
            inputs = kept.encode(role_config(spec.autoscaling, role), carry.role_samples[role], d.current, d.starting,
                                 now, before, role=role)
            self.keeper.keep_step(deployment, inputs, kept.decision_of(d, role), d.direction, f"{role}: {d.reason}")
        target, outcome, blocked, reasons = d.desired, None, False, []
        if d.direction == UP and d.delta > 0:
            target, outcome, blocked, reasons = await self._fit_role(deployment, spec, role, d.current, d.delta,
                                                                     carry, now, dry)
            if target == d.current:  # nothing placed, no step: the next re-check decides on the same windows
                carry.role_policy[role] = unstepped(before, carry.role_policy[role], now)
        carry.role_policy[role] = replace(carry.role_policy[role], wanted=d.desired if blocked else None)
        record = {"at": now, "role": role, "signals": sample.signals(), "current": d.current, "starting": d.starting,
                  "direction": d.direction, "rule": d.rule, "reason": d.reason, "desired": d.desired,
                  "target": target, "dry_run": outcome}
        self.metrics.observe_role(deployment, role, target, d.direction, d.rule, blocked)
        return RoleStep(role=role, current=d.current, target=target, blocked=blocked, reasons=reasons[:50],
                        record=record)

    async def _fit_role(self, deployment: str, spec: ModelSpec, role: str, current: int, k: int, carry, now: float,
                        dry: dict):
        """(target, dry-run outcome, blocked, reasons) for ``k`` more ``role`` members: only what fits.
        Both roles' dry runs of one step share a snapshot: the second sees the first's members booked,
        so two roles never both count on the same free GPU."""
        def run():
            rspec = role_spec(spec, RoleName(role))
            req = self.estimates.get(rspec)
            snap = dry.get("snapshot") or load_snapshot(self.engine)
            return rspec, req, fit_member(snap, spec, role, req, deployment, k, self.policy)

        rspec, req, f = await self.runner.run(run)
        dry["snapshot"] = f.after
        outcome = {"asked": f.asked, "fits": f.fits, "placed_on": [p.worker for p in f.placed], "reasons": f.reasons}
        if f.blocked and self.hook:
            want = {**demand(rspec, req, f), "deployment": deployment, "role": role}
            key, seen = json.dumps(want, sort_keys=True, default=str), carry.hooked.get(f"role:{role}") or {}
            if key != seen.get("key") or now - seen.get("at", 0) >= spec.autoscaling.interval_s:
                res = await asyncio.to_thread(capacity_hook.call, self.hook, want)
                outcome["hook"] = {"ok": res.ok, "detail": res.detail}
                carry.hooked[f"role:{role}"] = {"key": key, "at": now}
        return current + f.fits, outcome, f.blocked, f.reasons

    async def apply_role(self, deployment: str, role: str, replicas: int) -> int:
        """Set ``role``'s replicas through the deployment's ``scale_role`` update; the role's
        replicas it then wants."""
        h = self.client.get_workflow_handle(deployment_id(deployment))
        try:
            view = await h.execute_update(DEPLOYMENT_SCALE_ROLE, RoleScaleAsk(role=role, replicas=replicas),
                                          result_type=DeploymentView)
        except WorkflowUpdateFailedError as e:
            raise ApplicationError(f"scale {role} to {replicas} refused: {e.cause or e}", type="ScaleRefused",
                                   non_retryable=True) from None
        return next((int(r.get("replicas", 1)) for r in view.spec.get("roles") or [] if r.get("name") == role),
                    replicas)
