"""The ceiling workload: a workflow that runs one no-op activity."""

from datetime import timedelta

from temporalio import activity, workflow


@activity.defn(name="bench_noop")
async def noop(x: int) -> int:
    return x


@workflow.defn(name="BenchTrivialWorkflow")
class TrivialWorkflow:
    @workflow.run
    async def run(self, x: int) -> int:
        return await workflow.execute_activity("bench_noop", x, start_to_close_timeout=timedelta(seconds=30))
