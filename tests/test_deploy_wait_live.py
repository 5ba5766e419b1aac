"""``gpuflow deploy --wait`` against a live stack (Temporal dev server, a control-plane worker, one
agent with simulated GPUs, real processes), as a user runs it with ``--address`` only: exit 0 when
every replica is RUNNING, 3 when one cannot be placed (the decisive reasons, no '.;'), 1 when one
is ERROR (its reason). Then the failed replica's log through ``gpuflow logs`` and under its reason
in ``gpuflow status``, the log of the same replica once deleted, what ``status`` says of a deleted
deployment, and what deploy says of the replica count after ``gpuflow scale`` (issue 26)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from temporalio import workflow
from temporalio.client import WorkflowExecutionStatus
from temporalio.worker import Worker

from contracts.ids import instance_id
from tests.live import Live, cli, spec

FAIL = "python3 -c \"import sys; print('engine: refusing to start', flush=True); sys.exit(3)\""


def spec_file(tmp_path, name: str, drop: tuple[str, ...] = (), **kw) -> str:
    raw = {k: v for k, v in spec(name, **kw).model_dump(mode="json", exclude_none=True).items() if k not in drop}
    p = tmp_path / f"{name}-{len(drop)}.json"
    p.write_text(json.dumps(raw))
    return str(p)


async def test_deploy_wait_exit_codes_and_the_logs_of_the_failed(tmp_path):
    lv = await Live(str(tmp_path)).start({"h1": [24, 24]})
    try:
        # 0: both replicas (5 GiB each) RUNNING; progress on stderr, the verdict on stdout
        echo = spec_file(tmp_path, "echo", vram_gib=5, replicas=2)
        out = cli(lv, "deploy", echo, "--wait", "--timeout", "50")
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.splitlines() == ["deployment echo: created, 2 replica(s) wanted (the file)",
                                           "deployment echo: 2 of 2 replica(s) RUNNING"], out.stdout
        assert "deployment echo: " in out.stderr  # at least one progress line
        # the deployment's tasks go ahead of its replicas' on the control queue: Temporal's priority
        # key 2 (contracts/ids.py DEPLOYMENT_PRIORITY_KEY); a replica's workflow keeps the default (unset: 3)
        from contracts.ids import deployment_id

        def described(wid: str):
            return lv.client.get_workflow_handle(wid).describe()

        dep, inst = await described(deployment_id("echo")), await described(instance_id("echo-0"))
        assert dep.raw_description.workflow_execution_info.priority.priority_key == 2
        assert inst.raw_description.workflow_execution_info.priority.priority_key in (0, 3)

        # the file names replicas: 2. Scaled to 3 by hand, the same file takes it back to 2, loudly
        assert cli(lv, "scale", "echo", "3").returncode == 0
        out = cli(lv, "deploy", echo)
        assert out.returncode == 0 and out.stdout.strip() == "deployment echo: replicas 3 -> 2 from the file", out
        assert "was scaled to 3 since its last deploy" in out.stderr, out.stderr
        # a file without replicas keeps the count the deployment has (kubectl apply's rule)
        assert cli(lv, "scale", "echo", "3").returncode == 0
        out = cli(lv, "deploy", spec_file(tmp_path, "echo", drop=("replicas",), vram_gib=5))
        assert out.stdout.strip() == "deployment echo: nothing changed (3 replica(s))", out
        # a changed command rolls the replicas: warned
        out = cli(lv, "deploy", spec_file(tmp_path, "echo", drop=("replicas",), vram_gib=5,
                                         command="python3 -m http.server {port} --bind {host} --directory /"))
        assert "deployment echo: spec changed (run_command)" in out.stdout and "a rolling upgrade" in out.stderr, out

        # 3: 200 GiB fits no GPU of 24 GiB; the decisive reasons, their full stops not run into '; '
        out = cli(lv, "deploy", spec_file(tmp_path, "huge", vram_gib=200), "--wait", "--timeout", "50")
        assert out.returncode == 3, out.stdout + out.stderr
        assert "huge-0: PENDING: unschedulable: " in out.stderr and ".;" not in out.stderr, out.stderr

        # 1: the engine exits at start; its reason carries the log's last line
        out = cli(lv, "deploy", spec_file(tmp_path, "bad", vram_gib=1, command=FAIL), "--wait", "--timeout", "50")
        assert out.returncode == 1, out.stdout + out.stderr
        assert "bad-0: ERROR: exited with code 3 while starting: engine: refusing to start" in out.stderr, out.stderr

        # the failed replica's log, read on its host; and under its reason in status
        out = cli(lv, "logs", "bad-0")
        assert out.returncode == 0 and "engine: refusing to start" in out.stdout, out
        # it restarts after min(0.5 s * 2^(n-1), cap) (FAST): between two tries it is STARTING, and
        # the log shows under its reason only while ERROR, so status is read again until it is
        for _ in range(40):
            out = cli(lv, "status")
            lines = out.stdout.splitlines()
            at = next(k for k, ln in enumerate(lines) if ln.strip().startswith("bad-0"))
            if "ERROR" in lines[at]:
                break
            time.sleep(0.5)
        assert lines[at + 1].strip() == "| engine: refusing to start", out.stdout

        # deleted, its log is still on h1 (the agent keeps the last --keep-logs ended instances');
        # delete --wait has returned once the replica's workflow has closed, not only the deployment's
        assert cli(lv, "delete", "bad", "--wait").returncode == 0
        assert (await described(instance_id("bad-0"))).status != WorkflowExecutionStatus.RUNNING
        out = cli(lv, "logs", "bad-0")
        assert out.returncode == 0 and "engine: refusing to start" in out.stdout, out
        out = cli(lv, "status", "bad")
        assert out.returncode == 2 and "no deployment named 'bad': it was deleted" in out.stderr, out
        await until_closed_waits_for_a_running_workflow(lv)
    finally:
        lv.close()


@workflow.defn(name="Held", sandboxed=False)
class Held:
    """A workflow of the test's own under a replica's id, that runs until it is signalled."""

    def __init__(self) -> None:
        self.go = False

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self.go)

    @workflow.signal
    def end(self) -> None:
        self.go = True


async def until_closed_waits_for_a_running_workflow(lv: Live) -> None:
    """gpuflow/delete_wait.py until_closed, on the live Temporal server: it does not return while
    instance/held-0 runs (a replica that has told its deployment it ended, and not yet closed), and
    returns once it has closed; a replica without a workflow counts as closed."""
    from gpuflow.delete_wait import until_closed
    from gpuflow.runtime import Unreachable

    async with Worker(lv.client, task_queue="held", workflows=[Held]):
        h = await lv.client.start_workflow(Held.run, id=instance_id("held-0"), task_queue="held")
        waiting = asyncio.ensure_future(until_closed(lv.client, ["held-0", "never-0"], poll_s=0.1))
        await asyncio.sleep(1.5)  # fifteen reads, every one of which found it running
        assert not waiting.done()
        # one that does not close within the limit is named, not waited on for ever (exit 4 in the CLI)
        with pytest.raises(Unreachable, match=r"1 replica workflow\(s\) had not closed 1 s later \(instance/held-0\)"):
            await until_closed(lv.client, ["held-0"], poll_s=0.1, limit_s=1)
        await h.signal(Held.end)
        await asyncio.wait_for(waiting, 20)
        assert (await h.describe()).status == WorkflowExecutionStatus.COMPLETED
