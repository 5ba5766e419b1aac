"""QueueSweepWorkflow (id ``queue-sweep``): the PENDING queue's safety net, one per cluster.

Releases and hosts joining or changing wake the queue's heads that now fit
(activities/wake_queue.py). This workflow sweeps the queue as well, every ``pending_recheck_s``
of the control-plane worker that runs the sweep (the activity returns it): the heads that fit,
and the first waiting replica of each deployment (its request may not be costed there yet; it may
preempt a borrower; a new tenants file may have raised its limit). A PENDING replica keeps no
timer of its own, so the cost of the safety net grows with the deployments waiting, not with
their replicas. Every ``gpuflow server`` starts it at boot, keeping one already running; it is
visible in the Temporal UI like any other."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows import common as c

SWEEP_ID = "queue-sweep"


@workflow.defn(name="QueueSweepWorkflow")
class QueueSweepWorkflow:
    @workflow.run
    async def run(self) -> None:
        for _ in range(500):  # then a fresh history
            every: float = await workflow.execute_activity(c.SWEEP_QUEUE, summary="sweep the PENDING queue",
                                                           **c.STORE_CALL)
            await workflow.sleep(c.secs(max(float(every), 1.0)))  # a Timings figure: 30 days at most
        workflow.continue_as_new()
