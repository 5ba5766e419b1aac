"""Preemption in the instance workflow (scheduler/tenancy/preemption.py decides it; the decide
activity puts the victims in the decision; workflows/place_machine.py orders the steps).

The preemptor: the ledger moves the victims' GPUs to it in one transaction (PREEMPT:
preempt_placement), it signals each victim ``preempt`` (TELL_VICTIMS), and it launches only once
every victim answered ``victim_stopped`` (WAIT_VICTIMS) or the store shows it stopped
(ASK_VICTIMS: victims_left, asked when no word came within VICTIM_POLL_S).
A victim (on the signal): out of the routing table, drained, its processes stopped (stop_instance
on each host), PENDING in its own deployment with ``preempted by prod/chat-0 to reclaim
prod's guarantee`` (GIVE_WAY); it is placed again when capacity returns."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from contracts.ids import INSTANCE_PREEMPT, INSTANCE_VICTIM_STOPPED, instance_id
    from contracts.control import InstanceNames, PreemptNotice, ReserveResult, VictimStopped
    from contracts.placement import PreemptAsk
    from scheduler.spec import ModelSpec
    from workflows import common as c
    from workflows.instance_base import InstanceBase
    from workflows.instance_state import Action, Event


class PreemptSteps(InstanceBase):
    async def _give_way(self) -> None:
        """Preempted: its processes are stopped (stop_instance on each host), its GPUs already
        belong to the preemptor in the ledger (the release finds nothing, or a later booking this
        notice overtook). PENDING with the preemptor named; the preemptor hears it may launch."""
        n, self.s.preempted = self.s.preempted, None
        await self._release()
        self.s.preempted_why = n.reason
        await self._record("pending", n.reason)
        try:
            await workflow.get_external_workflow_handle(instance_id(n.instance)).signal(
                INSTANCE_VICTIM_STOPPED, VictimStopped(instance=self.inp.name))
        except Exception:  # noqa: BLE001  the preemptor may be gone; it also asks the store
            pass

    async def _on_preempt(self, a: Action, spec: ModelSpec) -> Event:
        """Book the decision by moving its victims' GPUs: ``preempting`` (booked), ``stale`` (a
        victim or the capacity moved: decide again) or ``book_failed``."""
        try:
            booked: ReserveResult = await workflow.execute_activity(
                c.PREEMPT_PLACEMENT, PreemptAsk(instance=self.inp.name, decision=self.s.decision),
                result_type=ReserveResult, start_to_close_timeout=c.secs(120), heartbeat_timeout=c.CONTROL_HEARTBEAT,
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=5),
                                         non_retryable_error_types=["StaleDecision", "InvalidInput"]))
        except ActivityError as e:
            kind, why = c.cause(e)
            return self._event("stale") if kind == "StaleDecision" else self._event("book_failed", why=why)
        return self._event("preempting", plan=booked.plan)

    async def _on_tell_victims(self, a: Action, spec: ModelSpec) -> Event:
        """SCHEDULED, waiting for them (the row names them), and each victim told."""
        d = self.s.decision
        await self._record(a.state, a.reason, decision=a.row)
        notice = PreemptNotice(by=f"{d.tenant}/{self.inp.name}", instance=self.inp.name, why=d.preempt_why)
        for v in a.names:
            try:
                await workflow.get_external_workflow_handle(instance_id(v)).signal(INSTANCE_PREEMPT, notice)
            except Exception:  # noqa: BLE001  ended meanwhile: the store says it holds nothing
                pass
        return self._event("told")

    async def _on_wait_victims(self, a: Action, spec: ModelSpec) -> Event:
        """``heard`` once each of them said it stopped (or a stop), ``quiet`` after ``a.seconds`` of silence."""
        s, left = self.s, set(a.names)
        try:
            await workflow.wait_condition(lambda: s.stop_requested or not (left - s.victims_stopped),
                                          timeout=c.secs(a.seconds))
        except asyncio.TimeoutError:
            return self._event("quiet")
        return self._event("heard")

    async def _on_ask_victims(self, a: Action, spec: ModelSpec) -> Event:
        """The victims the store still shows running (``asked``)."""
        still: InstanceNames = await workflow.execute_activity(
            c.VICTIMS_LEFT, InstanceNames(names=a.names), result_type=InstanceNames, **c.STORE_CALL)
        return self._event("asked", names=still.names)
