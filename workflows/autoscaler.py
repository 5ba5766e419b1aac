"""AutoscalerWorkflow (id ``autoscaler/<deployment>``): one per deployment whose spec has an
``autoscaling`` block, started by the deployment's workflow (an activity with USE_EXISTING, so
starting it again is a no-op). Every ``interval_s`` it runs ``autoscale_step`` (activities/
autoscale.py: signals, the pure policy, the scheduler's dry run) with ``now`` from the workflow's
clock and the state carried from the step before, then sets the step's ABSOLUTE replica count
through the deployment's ``scale`` update (its scale-down ranking and draining do the rest); a
prefill/decode group's step sets each autoscaled role's count through ``scale_role``, one record per
role (activities/autoscale_group.py). A
retried step or apply after a control-plane worker died therefore never applies a step twice.

While capacity-blocked it looks again every few seconds, so a host that joins lets the scale-up
through at once. The signal ``wake`` runs a step now. It keeps the last 50 decisions (query
``autoscale``), carried across continue-as-new, and ends when the deployment is deleted or its
spec loses ``autoscaling``."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from contracts import ui_text
    from contracts.ids import AUTOSCALER_VIEW, AUTOSCALER_WAKE, autoscaler_id
    from contracts.autoscale import (AUTOSCALE_APPLY, AUTOSCALE_STEP, HISTORY, ApplyAsk, AutoscalerInput,
                                     AutoscaleView, RoleStep, Step, StepAsk)
    from workflows import common as c
    from workflows import guards, signals
    from workflows.inputs import one_input

BLOCKED_RECHECK_S = 3.0
STEP_CALL = dict(start_to_close_timeout=timedelta(seconds=60), heartbeat_timeout=timedelta(seconds=20),
                 retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=10),
                                          maximum_attempts=3))


@workflow.defn(name="AutoscalerWorkflow")
class AutoscalerWorkflow:
    @workflow.init
    def __init__(self, *args: Any) -> None:
        inp = one_input(args, AutoscalerInput, "AutoscalerWorkflow")
        self.deployment = inp.deployment
        self.history = list(inp.history)[-HISTORY:]
        self.carry = dict(inp.carry)
        self.woken = False
        self.last: Step | None = None
        self.ended = ""
        self.cold_at: float | None = None  # when a cold start (0 -> 1) was applied, until a replica runs
        self.cold_starts = list(inp.cold_starts)[-10:]

    @workflow.query(name=AUTOSCALER_VIEW)
    def autoscale(self) -> AutoscaleView:
        last = self.last
        return AutoscaleView(deployment=self.deployment, desired=last.target if last and not last.done else None,
                             capacity_blocked=bool(last and last.blocked), blocked_reasons=last.reasons if last else [],
                             ended=self.ended, history=list(self.history), cold_starts=list(self.cold_starts),
                             roles=[{"role": r.role, "desired": r.target, "capacity_blocked": r.blocked,
                                     "blocked_reasons": r.reasons} for r in (last.roles if last else [])])

    @workflow.signal(name=AUTOSCALER_WAKE)
    def wake(self, *args: Any) -> None:
        """Decide now (the gateway holds a request for a deployment at zero replicas). Carries
        nothing; a wake that does is refused, logged and counted (workflows/signals.py)."""
        if signals.none(AUTOSCALER_WAKE, args):
            self.woken = True

    @workflow.run
    async def run(self, *args: Any) -> AutoscaleView:
        guards.workflow_id(autoscaler_id(self.deployment), f"deployment name {self.deployment!r}")
        while True:
            self.woken = False
            step = await self._step()
            if step is not None and step.done:
                self.ended = step.done
                return self.autoscale()
            wait = 5.0 if step is None else step.interval_s
            if step is not None and (step.blocked or self.cold_at is not None):
                wait = min(wait, BLOCKED_RECHECK_S if step.blocked else 1.0)
            try:
                await workflow.wait_condition(lambda: self.woken, timeout=c.secs(wait))
            except asyncio.TimeoutError:
                pass
            if workflow.info().is_continue_as_new_suggested():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(AutoscalerInput(deployment=self.deployment, history=self.history,
                                                         carry=self.carry, cold_starts=self.cold_starts))

    async def _step(self) -> Step | None:
        now = workflow.now().timestamp()
        try:
            step = await workflow.execute_activity(AUTOSCALE_STEP, StepAsk(deployment=self.deployment, carried=self.carry,
                                                                           now=now), result_type=Step, **STEP_CALL)
        except ActivityError as e:
            self._keep({"at": now, "direction": "error", "rule": "-", "reason": c.cause(e)[1], "done": "nothing"})
            return None
        if step.done:
            return step
        self.carry, self.last = step.carry, step
        if step.roles:  # a prefill/decode group: each role's count set on its own, one record each
            recs = [await self._apply_role(rs) for rs in step.roles]
            self.history = (self.history + recs)[-HISTORY:]
            workflow.set_current_details("\n\n".join(  # the Temporal UI: every role's last step, named
                ui_text.autoscaler_current({**r, "rule": f"{r.get('role')}: {r.get('rule', '-')}"}) for r in recs))
            return step
        rec = dict(step.record)
        if step.target != step.current:
            try:
                got = await workflow.execute_activity(AUTOSCALE_APPLY, ApplyAsk(deployment=self.deployment,
                                                                                replicas=step.target),
                                                      result_type=int, **STEP_CALL)
                rec["done"] = f"replicas {step.current} -> {got}"
                if rec.get("rule") == "cold_start":
                    self.cold_at = now
            except ActivityError as e:
                rec["done"] = f"not applied: {c.cause(e)[1]}"
        elif step.blocked:
            rec["done"] = "capacity-blocked: nothing added"
        else:
            rec["done"] = "nothing"
        if self.cold_at is not None and rec.get("signals", {}).get("running_replicas", 0) >= 1:
            rec["cold_start_s"] = round(now - self.cold_at, 3)
            self._cold({"at": self.cold_at, "decision_to_running_s": rec["cold_start_s"]})
            self.cold_at = None
        if "cold_start_first_token_s" in rec:  # measured by the gateways
            self._cold({"at": now, "request_to_first_token_s": rec["cold_start_first_token_s"]})
        self._keep(rec)
        return step

    async def _apply_role(self, rs: RoleStep) -> dict:
        """One role's count set through the deployment's ``scale_role``; a role that cannot be set
        (or does not fit) says so, and the other role's step is applied regardless."""
        rec = dict(rs.record)
        if rs.target != rs.current:
            try:
                got = await workflow.execute_activity(AUTOSCALE_APPLY, ApplyAsk(deployment=self.deployment,
                                                                                replicas=rs.target, role=rs.role),
                                                      result_type=int, **STEP_CALL)
                rec["done"] = f"{rs.role} {rs.current} -> {got}"
            except ActivityError as e:
                rec["done"] = f"not applied: {c.cause(e)[1]}"
        elif rs.blocked:
            rec["done"] = f"capacity-blocked: no {rs.role} added"
        else:
            rec["done"] = "nothing"
        return rec

    def _cold(self, entry: dict) -> None:
        self.cold_starts = (self.cold_starts + [entry])[-10:]

    def _keep(self, rec: dict) -> None:
        self.history = (self.history + [rec])[-HISTORY:]
        workflow.set_current_details(ui_text.autoscaler_current(rec))  # the Temporal UI's view of its last step
