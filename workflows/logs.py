"""LogReadWorkflow: one read of an instance's log, from the host that runs it. A workflow so the
CLI needs only Temporal to reach any host's files; short-lived, one activity on the host queue."""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.payloads import host_queue
    from worker_agent import payloads as hp
    from workflows import common as c
    from workflows.inputs import one_input


@workflow.defn(name="LogReadWorkflow")
class LogReadWorkflow:
    @workflow.run
    async def run(self, *args: Any) -> hp.LogChunk:
        req = one_input(args, hp.LogRequest, "LogReadWorkflow")
        return await workflow.execute_activity(
            hp.READ_LOG, req, result_type=hp.LogChunk, task_queue=host_queue(req.worker),
            schedule_to_start_timeout=c.secs(10), start_to_close_timeout=c.secs(30),
            retry_policy=RetryPolicy(maximum_attempts=1))
