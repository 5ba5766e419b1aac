"""Preemption in the instance workflow (scheduler/tenancy/preemption.py decides it; the decide
activity puts the victims in the decision).

The preemptor: the ledger moves the victims' GPUs to it in one transaction (preempt_placement),
it signals each victim ``preempt``, and it launches only once every victim answered
``victim_stopped`` (or the store shows it stopped: victims_left, asked every VICTIM_POLL_S).
A victim (on the signal): out of the routing table, drained, its processes stopped (its
supervisors cancelled), PENDING in its own deployment with ``preempted by prod/chat-0 to reclaim
prod's guarantee``; it is placed again when capacity returns."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from contracts.ids import INSTANCE_PREEMPT, INSTANCE_VICTIM_STOPPED, instance_id
    from contracts.control import DecisionRecord, EstimateRecord, InstanceNames, PreemptNotice, ReserveResult
    from contracts.placement import PreemptAsk
    from workflows import common as c
    from workflows.instance_base import InstanceBase

VICTIM_POLL_S = 10.0  # the preemptor asks the store this often whether its victims stopped (signals come first)


class PreemptSteps(InstanceBase):
    async def _give_way(self) -> None:
        """Preempted: its processes are stopped (the supervisors were cancelled), its GPUs already
        belong to the preemptor in the ledger (the release finds nothing, or a later booking this
        notice overtook). PENDING with the preemptor named; the preemptor hears it may launch."""
        n, self.s.preempted = self.s.preempted, None
        await self._release()
        self.s.preempted_why = n.reason
        await self._record("pending", n.reason)
        try:
            await workflow.get_external_workflow_handle(instance_id(n.instance)).signal(INSTANCE_VICTIM_STOPPED,
                                                                                         self.inp.name)
        except Exception:  # noqa: BLE001  the preemptor may be gone; it also asks the store
            pass

    async def _preempt(self, d: DecisionRecord, est: EstimateRecord) -> bool | None:
        """Book ``d`` by preemption, tell the victims, wait until their processes stopped. True once
        booked; None: decide again (stale); False: stopping."""
        s = self.s
        try:
            booked: ReserveResult = await workflow.execute_activity(
                c.PREEMPT_PLACEMENT, PreemptAsk(instance=self.inp.name, decision=d), result_type=ReserveResult,
                start_to_close_timeout=c.secs(120), heartbeat_timeout=c.CONTROL_HEARTBEAT,
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=5),
                                         non_retryable_error_types=["StaleDecision", "InvalidInput"]))
        except ActivityError as e:
            if c.cause(e)[0] == "StaleDecision":
                return None
            await self._give_up(f"cannot book the placement: {c.cause(e)[1]}")
            return False
        s.plan, s.preempted_why = booked.plan, ""
        names = [v.name for v in d.victims]
        why = f"preempting {', '.join(names)} {d.preempt_why}".rstrip()
        await self._record("scheduled", f"{why}; waiting for them to stop",
                           decision=d.preempting_row(est.summary))
        notice = PreemptNotice(by=f"{d.tenant}/{self.inp.name}", instance=self.inp.name, why=d.preempt_why)
        for v in names:
            try:
                await workflow.get_external_workflow_handle(instance_id(v)).signal(INSTANCE_PREEMPT, notice)
            except Exception:  # noqa: BLE001  ended meanwhile: the store says it holds nothing
                pass
        left = set(names)
        while not s.stop_requested:
            left -= s.victims_stopped
            if not left:
                break
            try:
                await workflow.wait_condition(lambda: s.stop_requested or not (left - s.victims_stopped),
                                              timeout=c.secs(VICTIM_POLL_S))
            except asyncio.TimeoutError:
                still: InstanceNames = await workflow.execute_activity(
                    c.VICTIMS_LEFT, InstanceNames(names=sorted(left)), result_type=InstanceNames, **c.STORE_CALL)
                left = set(still.names)
        await self._record("scheduled", f"{why}; they stopped")
        return True
