"""A control plane that does not answer is an outage, not the user's mistake (issue 40, low): with the
Temporal dev server up and no control-plane worker polling, a deploy's update and a status query give up
with ``Unreachable`` (the CLI's exit 4, "did not answer"), never ``InvalidInput`` (exit 2, which tells
the user to fix their input). An agent stopped while it waits for its hello's verdict, with no control
plane to give one, stops at once; and deploy's look gives up on a replica that does not answer yet."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from temporalio.service import RPCError

from contracts.ids import INSTANCE_WORKFLOW, host_id, instance_id
from gpuflow import broken, deploy_look, ops
from gpuflow.dev import Stack
from gpuflow.dev.temporal import DevServer
from gpuflow.ports import server_port
from gpuflow.runtime import Unreachable, connect
from gpuflow.settings import TemporalSettings
from tests.live import spec, write_inventory
from worker_agent.agent import HELLO_WAIT_S

pytestmark = pytest.mark.asyncio


async def test_a_control_plane_that_does_not_answer_is_unreachable_not_invalid(tmp_path, monkeypatch):
    server = DevServer(str(tmp_path), port=server_port(), ui_port=None).start()
    try:
        client = await connect(TemporalSettings(address=server.address), wait_s=20)
        monkeypatch.setattr(ops, "UPDATE_TIMEOUT_S", 2.0)  # the CLI waits 60 s
        monkeypatch.setattr(broken, "QUERY_TIMEOUT_S", 2.0)  # and 10 s
        with pytest.raises(Unreachable, match="did not answer within 2 s"):
            await ops.deploy(client, spec("web"))
        with pytest.raises(Unreachable, match="did not answer a query within 2 s"):
            await ops.current(client, "web")
    finally:
        server.stop()


async def test_an_agent_stopped_while_its_hello_awaits_a_verdict_stops_at_once(tmp_path):
    """With no control-plane worker, an agent's hello is sent (its host workflow exists) but no verdict
    comes; the agent waits HELLO_WAIT_S (10 s) for one before it polls its queue. A SIGTERM then ends
    the wait: the agent exits at once, without serving its queue, not after the 10 s."""
    stack = Stack(str(tmp_path / "gpuflow"), port=server_port(), ui_port=None)
    try:
        stack.start_temporal()
        agent = stack.start_agent("h1", write_inventory(str(tmp_path / "h1.yaml"), [24]))
        client = await connect(TemporalSettings(address=stack.temporal.address), wait_s=20)

        async def hello_sent() -> bool:
            try:
                await client.get_workflow_handle(host_id("h1")).describe()
                return True
            except RPCError:
                return agent.poll() is not None  # an agent that died is read below
        deadline = time.monotonic() + 60
        while not await hello_sent():
            assert time.monotonic() < deadline, "the agent's hello did not start its host workflow in 60 s"
            await asyncio.sleep(0.1)
        assert agent.poll() is None, open(os.path.join(stack.log_dir, "agent-h1.log")).read()
        sent = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(agent.wait, 30)
        took = time.monotonic() - sent
        log = open(os.path.join(stack.log_dir, "agent-h1.log")).read()
        # before the fix: HELLO_WAIT_S less the moment since the hello, about 9.7 s
        assert took < HELLO_WAIT_S / 2, f"the agent took {took:.1f} s to stop; its log:\n{log}"
        assert code == 0, log
        assert "serving" not in log, log  # it never polled its host's queue
    finally:
        stack.stop(kill=True)


async def test_the_deploy_looks_question_to_a_replica_not_yet_deciding_gives_up_in_ask_s(tmp_path):
    """deploy's look (deploy_look.judged) asks the first PENDING replicas why they wait. A replica
    whose first workflow task has not run (here: no control-plane worker at all; in a burst, queued
    behind the others) does not answer: the look takes it as still deciding after ASK_S (2 s), not
    after the status query's QUERY_TIMEOUT_S (10 s)."""
    server = DevServer(str(tmp_path), port=server_port(), ui_port=None).start()
    try:
        client = await connect(TemporalSettings(address=server.address), wait_s=20)
        for k in range(2):  # real workflows of the replicas' type, that no worker runs
            await client.start_workflow(INSTANCE_WORKFLOW, {"name": f"m-{k}"}, id=instance_id(f"m-{k}"),
                                        task_queue="nobody-polls")
        t0 = time.monotonic()
        said = await deploy_look.judged(client, "m", 2, {"m-0": "pending", "m-1": "pending"}, late=False)
        took = time.monotonic() - t0
        assert said is None  # still deciding: the look goes on
        # the two asked at once, each given up at ASK_S: 2 s, where the status query's 10 s had been
        assert deploy_look.ASK_S <= took < broken.QUERY_TIMEOUT_S / 2, took
        assert await deploy_look.judged(client, "m", 2, {"m-0": "pending", "m-1": "pending"}, late=True) == []
    finally:
        server.stop()
