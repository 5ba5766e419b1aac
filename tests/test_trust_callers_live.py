"""The control plane's activities act only for their own workflow, and what gives capacity or
traffic is proven (issue 40 follow-up), on the dev stack (tests/live.py: the Temporal dev server, a
control-plane worker, an agent with simulated GPUs). Each attack is a workflow of one's own, on
one's own worker, scheduling the control plane's activity on gpuflow-control, as anyone who can
reach Temporal can (its workflow may take our workflows' type names, and any id no workflow holds):

- a forged ``host/hfake`` calling host_seen with 2 x 800 GiB writes no inventory (and calling it
  for h1 is refused by the caller rule);
- a workflow of one's own recording a running replica at an address of its own is refused, and the
  gateways' route for the replica keeps its real address;
- a workflow named for a deleted replica, with that replica's own launch MAC copied from its
  history, cannot record it RUNNING at another address;
- signals whose payload does not validate change nothing, and are counted on the control plane's
  /metrics (gpuflow_signals_refused) and logged; the workflows they were sent to go on.

Each failed on the code before the change (host_seen took any report, record_instance any record,
and the signals were dropped by the SDK without a count)."""

from __future__ import annotations

import asyncio
import urllib.request
import uuid
from datetime import timedelta

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError
from temporalio.worker import Worker

from contracts.control import CONTROL_QUEUE
from gpuflow import ops
from store import records, serving
from tests.live import FAST, Live, cli, spec

pytestmark = pytest.mark.asyncio
GiB = 2**30
BIG = [{"index": i, "vram_total": 800 * GiB, "name": "Forged 800G"} for i in range(2)]


async def call(args: list) -> str:
    """Schedule the control plane's activity ``args[0]`` with input ``args[1]``: what it answered."""
    name, arg = args
    try:
        await workflow.execute_activity(name, arg, task_queue=CONTROL_QUEUE, start_to_close_timeout=timedelta(seconds=30),
                                        retry_policy=RetryPolicy(maximum_attempts=1))
    except ActivityError as e:
        return f"{getattr(e.cause, 'type', '')}: {getattr(e.cause, 'message', e.cause)}"
    return "done"


@workflow.defn(name="HostWorkflow", sandboxed=False)
class ForgedHost:
    """Somebody's own workflow, of our host workflow's type name, on somebody's own worker."""

    @workflow.run
    async def run(self, args: list) -> str:
        return await call(args)


@workflow.defn(name="ModelInstanceWorkflow", sandboxed=False)
class ForgedInstance:
    @workflow.run
    async def run(self, args: list) -> str:
        return await call(args)


@workflow.defn(name="Mine", sandboxed=False)
class Mine:
    @workflow.run
    async def run(self, args: list) -> str:
        return await call(args)


async def forged(lv: Live, kind: str, wid: str, activity: str, arg: dict) -> str:
    queue = f"own-{uuid.uuid4().hex[:8]}"
    async with Worker(lv.client, task_queue=queue, workflows=[ForgedHost, ForgedInstance, Mine]):
        return await lv.client.execute_workflow(kind, [activity, arg], id=wid, task_queue=queue)


def report(name: str) -> dict:
    """A forged report in both shapes host_seen has taken: a HostReport's fields (before) and a
    ReportCheck's (now); each model ignores the other's fields."""
    fake = {"name": name, "ram_total": 2**40, "gpus": BIG, "boot": "forged"}
    return {**fake, "host": name, "purpose": "hello", "report": fake, "now_ms": 0}


async def test_a_forged_host_workflow_calling_host_seen_writes_no_inventory(tmp_path):
    lv = await Live(str(tmp_path)).start({"h1": [24]})
    try:
        await ops.deploy(lv.client, spec("big700", vram_gib=700), FAST)
        await lv.wait(lambda: lv.states("big700") == {"big700-0": "pending"}, 60, "big700 PENDING")
        said = await forged(lv, "HostWorkflow", "host/hfake", "host_seen", report("hfake"))
        assert said.startswith("ReportRefused: host hfake's report writes no inventory: host hfake has not joined"), said
        said = await forged(lv, "HostWorkflow", "host/hfake", "host_seen", report("h1"))  # for a live host
        assert said.startswith("InvalidInput: host_seen acts only for the workflow its input names (HostWorkflow "
                               "'host/h1'); called by HostWorkflow 'host/hfake'"), said
        assert [w.name for w in records.workers(lv.engine)] == ["h1"]
        assert [g["vram_total"] for g in records.workers(lv.engine)[0].gpus] == [24 * GiB]
        assert lv.states("big700") == {"big700-0": "pending"}  # nothing holds 700 GiB
    finally:
        lv.close()


def routes(lv: Live, deployment: str) -> dict[str, tuple[str, int]]:
    """What the gateways route (store/serving.py: they read this table)."""
    return {r.instance: (r.address, r.port) for r in serving.routes(lv.engine) if r.deployment == deployment}


async def last_launch(lv: Live, instance: str) -> dict:
    """The replica's last launch result, as anyone who reads its workflow's history can copy it."""
    hist = await lv.client.get_workflow_handle(f"instance/{instance}").fetch_history()
    done = [e.activity_task_completed_event_attributes for e in hist.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED]
    results = [(await lv.client.data_converter.decode(d.result.payloads, [dict]))[0] for d in done if d.result.payloads]
    return [r for r in results if isinstance(r, dict) and "key_id" in r][-1]


async def test_only_the_replicas_own_proven_launch_records_it_running(tmp_path):
    lv = await Live(str(tmp_path)).start({"h1": [24]})
    try:
        await ops.deploy(lv.client, spec("legit", vram_gib=10), FAST)
        await lv.wait(lambda: lv.states("legit") == {"legit-0": "running"}, 60, "legit RUNNING")
        real = routes(lv, "legit")["legit-0"]
        launch = await last_launch(lv, "legit-0")
        rec = {"name": "legit-0", "deployment": "legit", "model": "legit", "state": "running", "worker": "h1",
               "pid": launch["pid"], "port": 9, "address": "203.0.113.9", "key_id": launch["key_id"],
               "launch_mac": launch.get("mac", "")}
        # 1. a workflow of one's own records the running replica at its address: refused, by the caller rule
        said = await forged(lv, "Mine", f"mine/{uuid.uuid4().hex[:8]}", "record_instance", rec)
        assert said.startswith("InvalidInput: record_instance acts only for the workflow its input names "
                               "(ModelInstanceWorkflow 'instance/legit-0'); called by Mine"), said
        assert routes(lv, "legit") == {"legit-0": real}  # the gateways still send users to the real one
        # 2. deleted, its id is free: a workflow named for it, of our type name, with its own launch's MAC
        out = cli(lv, "delete", "legit", "--wait")
        assert out.returncode == 0, out.stderr
        said = await forged(lv, "ModelInstanceWorkflow", "instance/legit-0", "record_instance", rec)
        assert said.startswith("LaunchUnproven: refused to record legit-0 RUNNING: instance legit-0 is not booked "
                               "on host h1"), said
        # ... and with the real address, port and MAC as launched: still not booked, still nothing
        said = await forged(lv, "ModelInstanceWorkflow", "instance/legit-0", "record_instance",
                            {**rec, "address": launch["address"], "port": launch["port"],
                             "kv_events_port": launch.get("kv_events_port")})
        assert said.startswith("LaunchUnproven:"), said
        assert routes(lv, "legit") == {} and lv.states("legit") == {}
    finally:
        lv.close()


def refused_signals(lv: Live) -> dict[str, float]:
    """gpuflow_signals_refused by signal, from the control plane's /metrics (the SDK's series appended)."""
    with urllib.request.urlopen(f"http://{lv.stack.metrics['server-0']}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("gpuflow_signals_refused") and "{" in line:
            labels, value = line.rsplit(" ", 1)
            sig = labels.split('signal="')[1].split('"')[0]
            out[sig] = out.get(sig, 0) + float(value)
    return out


async def test_forged_signals_change_nothing_and_are_counted(tmp_path):
    lv = await Live(str(tmp_path)).start({"h1": [24]})
    try:
        await ops.deploy(lv.client, spec("web", vram_gib=10), FAST)
        await lv.wait(lambda: lv.states("web") == {"web-0": "running"}, 60, "web RUNNING")
        inst = lv.client.get_workflow_handle("instance/web-0")
        dep = lv.client.get_workflow_handle("deployment/web")
        await inst.signal("preempt", {"by": "x", "instance": "../../etc"})  # not an instance name
        await inst.signal("preempt", "garbage")
        await inst.signal("victim_stopped", 42)
        await inst.signal("host_news", {"host": "h1", "kind": "exploded"})
        await inst.signal("capacity_changed", "extra")
        await dep.signal("instance_ended", "other-0")  # another deployment's replica: web would have replaced none
        await dep.signal("instance_ended", {"name": "web-0"})
        want = {"preempt": 2, "victim_stopped": 1, "host_news": 1, "capacity_changed": 1, "instance_ended": 2}

        async def counted() -> bool:
            return refused_signals(lv) == want

        await lv.wait_async(counted, 60, f"the refused signals counted: {want}")
        # nothing changed: the replica runs, answers its query, and is deleted as asked
        view = await inst.query("status")
        assert view["state"] == "running" and lv.states("web") == {"web-0": "running"}
        out = cli(lv, "delete", "web", "--wait")
        assert out.returncode == 0, out.stderr
        assert lv.states("web") == {}
    finally:
        lv.close()
