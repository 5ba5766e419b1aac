"""The control plane end to end, its deployments' side: deploy, scale down in order, delete,
start from the Temporal CLI, a burst with the control plane killed, a restart of the dev server,
bad input, a PENDING replica placed when a host joins, a terminated instance replaced. The real
Temporal dev server, control-plane and agent processes, real instance processes (python3 -m
http.server), the store on SQLite and on PostgreSQL. The hosts' side (outages, lost and returning
hosts, agent restarts, inventory changes) is tests/test_control_plane_hosts.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess

import pytest

from store import ledger
from gpuflow import ops
from gpuflow.dev.temporal import temporal_binary
from tests.live import FAST, Live, cli, spec
from tests.store_fixtures import PG_URL, pg_schema
from workflows.common import SA_MODEL, SA_STATE


@pytest.fixture(params=["sqlite", "postgresql"])
async def live(request, tmp_path):
    if request.param == "postgresql":
        schema, drop = pg_schema()
        lv = Live(str(tmp_path), database_url=PG_URL, schema=schema)
    else:
        drop, lv = None, Live(str(tmp_path))
    yield lv
    lv.close()
    if drop:
        drop()


def alive(lv: Live, host: str, instance: str) -> bool:
    t = lv.stack.instance_processes(host)
    r = t.find(instance)
    return r is not None and t.alive(r.pid)


async def test_deploy_scale_down_in_order_and_delete(live):
    """3 hosts of one 24 GiB GPU; 3 replicas of 10 GiB spread one per host. One replica's
    process is killed and, with a long restart backoff, sits in ERROR: scaling 3 -> 2 removes
    it first (status scores 0 vs 100). Then 2 -> 1, then delete: every process stops and the
    ledger is empty."""
    lv = await live.start({"h1": [24], "h2": [24], "h3": [24]})
    slow_restart = FAST.model_copy(update={"restart_base_s": 120, "restart_cap_s": 120})
    await ops.deploy(lv.client, spec("chat", replicas=3), slow_restart)
    await lv.wait(lambda: list(lv.states("chat").values()) == ["running"] * 3, 60, "3 replicas RUNNING")
    insts = lv.instances("chat")
    assert sorted(i.worker for i in insts) == ["h1", "h2", "h3"]  # spread: one per host
    assert all(alive(lv, i.worker, i.name) for i in insts)
    assert ledger.booked_per_gpu(lv.engine) == {(h, 0): 10 * 2**30 for h in ("h1", "h2", "h3")}

    # the Temporal UI's filters: every RUNNING instance of model chat
    q = f"{SA_MODEL.name} = 'chat' AND {SA_STATE.name} = 'RUNNING' AND WorkflowType = 'ModelInstanceWorkflow'"
    found = []
    for _ in range(30):
        found = sorted([w.id async for w in lv.client.list_workflows(q)])
        if len(found) == 3:
            break
        await asyncio.sleep(0.3)
    assert found == sorted(f"instance/{i.name}" for i in insts)

    victim = insts[1]
    rec = lv.stack.instance_processes(victim.worker).find(victim.name)
    os.killpg(rec.pid, signal.SIGKILL)
    await lv.wait(lambda: lv.states("chat")[victim.name] == "error", 30, f"{victim.name} ERROR")
    row = next(i for i in lv.instances("chat") if i.name == victim.name)
    assert "exited with code -9" in row.reason and "restart 1" in row.reason

    await ops.scale(lv.client, "chat", 2)
    await lv.wait(lambda: victim.name not in lv.states("chat"), 30, f"{victim.name} removed first")
    assert sorted(lv.states("chat").values()) == ["running", "running"]

    # the CLI's view of the same thing
    out = cli(lv, "status", "chat", "--json")
    assert out.returncode == 0, out.stderr
    st = json.loads(out.stdout)["deployments"][0]
    assert st["replicas"] == 2 and sorted(i["state"] for i in st["instances"]) == ["running", "running"]
    first = st["instances"][0]["name"]
    out = cli(lv, "explain", first, "--json")
    assert out.returncode == 0, out.stderr
    ex = json.loads(out.stdout)
    assert ex["scheduled"] and ex["decision"]["filters"] and ex["decision"]["candidates"]

    await ops.scale(lv.client, "chat", 1)
    await lv.wait(lambda: len(lv.states("chat")) == 1, 30, "one replica left")
    await ops.delete(lv.client, "chat", wait=True)
    assert lv.states("chat") == {}
    assert ledger.booked_per_gpu(lv.engine) == {}
    assert not any(alive(lv, i.worker, i.name) for i in insts if i.worker)

    # the workflows are deterministic: their recorded histories replay against today's code
    from gpuflow.converter import DATA_CONVERTER
    from temporalio.worker import Replayer

    from gpuflow.server import WORKFLOWS

    replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER)
    for wid in ["deployment/chat", "host/h1"] + [f"instance/{i.name}" for i in insts]:
        history = await lv.client.get_workflow_handle(wid).fetch_history()
        await replayer.replay_workflow(history)


async def test_temporal_cli_starts_a_deployment_with_plain_json(tmp_path):
    """`temporal workflow start` with plain JSON input is a first-class way in; a bad spec fails
    the workflow with the validation message instead of retrying forever."""
    lv = await Live(str(tmp_path)).start({"h1": [24]})
    try:
        body = {"spec": {"name": "from-cli", "source": {"local_path": "/m"}, "backend": "custom",
                         "run_command": "python3 -m http.server {port} --bind 127.0.0.1",
                         "resources": {"vram": "4 GiB"}}, "replicas": 1,
                "timings": FAST.model_dump()}
        base = [temporal_binary(), "workflow", "start", "--address", lv.stack.temporal.address,
                "--task-queue", "gpuflow-control", "--type", "ModelDeploymentWorkflow"]
        out = subprocess.run(base + ["--workflow-id", "deployment/from-cli", "--input", json.dumps(body)],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        await lv.wait(lambda: list(lv.states("from-cli").values()) == ["running"], 60, "RUNNING")

        bad = {"spec": {"name": "bad", "source": {"local_path": "/m"}, "backend": "tensorrt"}}
        out = subprocess.run(base + ["--workflow-id", "deployment/bad", "--input", json.dumps(bad)],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        h = lv.client.get_workflow_handle("deployment/bad")
        with pytest.raises(Exception) as e:
            await h.result()
        assert "invalid model spec" in str(e.value.cause) and "backend" in str(e.value.cause)
    finally:
        lv.close()


async def test_burst_of_50_with_control_plane_killed(tmp_path):
    """50 deployments at once (10 GiB each) on 2 hosts x 2 GPUs x 24 GiB: 2 fit per GPU, so 8
    RUNNING and 42 PENDING with reasons. Two control-plane workers serve the burst; one is
    SIGKILLed mid-burst and started again. At no point does the ledger book more than a GPU
    holds; afterwards no reservation is leaked or doubled, and deleting two running
    deployments lets two pending ones through at once."""
    lv = await Live(str(tmp_path)).start({"h1": [24, 24], "h2": [24, 24]}, servers=2)
    try:
        names = [f"m{k:02d}" for k in range(50)]
        await asyncio.gather(*(ops.deploy(lv.client, spec(n), FAST) for n in names))

        def never_overbooked():
            assert ledger.overbooked(lv.engine) == []

        await asyncio.sleep(1.0)
        victim = lv.stack.servers[0]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        lv.stack.start_server()

        def settled():  # every instance decided: RUNNING, or PENDING with the decision's reasons
            rows = [i for i in lv.instances() if i.state != "deleted"]
            return len(rows) == 50 and all(i.state == "running" or (i.state == "pending" and i.reason) for i in rows) \
                and sum(i.state == "running" for i in rows) == 8

        await lv.wait(settled, 240, "8 RUNNING, 42 PENDING", every=0.5, check=never_overbooked)
        rows = lv.instances()
        running = [i for i in rows if i.state == "running"]
        pending = [i for i in rows if i.state == "pending"]
        odd = [f"{i.name}: {i.reason}" for i in pending if not ("unschedulable" in i.reason and "GiB" in i.reason)]
        assert not odd, odd  # every one named, with its reason (a held one says whom it waits behind)
        assert all(alive(lv, i.worker, i.name) for i in running)
        per_gpu = ledger.booked_per_gpu(lv.engine)
        assert per_gpu == {(h, g): 20 * 2**30 for h in ("h1", "h2") for g in (0, 1)}  # 2 x 10 GiB on every GPU
        from sqlmodel import Session, select

        from store.tables import ReservationRow

        with Session(lv.engine) as s:
            held = sorted(r.instance for r in s.exec(select(ReservationRow)))
        assert held == sorted(i.name for i in running)  # one line each: nothing leaked, nothing doubled

        gone = [running[0].deployment, running[1].deployment]
        await asyncio.gather(*(ops.delete(lv.client, d) for d in gone))
        await lv.wait(lambda: list(lv.states().values()).count("running") == 8 and
                      not any(d in {i.deployment for i in lv.instances() if i.state != "deleted"} for d in gone),
                      60, "two pending deployments take the freed room", check=never_overbooked)
    finally:
        lv.close()


async def test_dev_server_restart_keeps_workflows(tmp_path):
    """The Temporal dev server is stopped and started again on the same SQLite file: the
    deployment and its instances carry on (still RUNNING, the same processes), and a later
    scale-up is served as usual."""
    lv = await Live(str(tmp_path)).start({"h1": [24, 24]})
    try:
        await ops.deploy(lv.client, spec("keep", replicas=2), FAST)
        await lv.wait(lambda: list(lv.states("keep").values()) == ["running"] * 2, 60, "2 RUNNING")
        pids = {i.name: i.pid for i in lv.instances("keep")}
        lv.stack.temporal.stop()
        lv.stack.temporal.start()
        from gpuflow.runtime import connect
        from gpuflow.settings import TemporalSettings

        lv.client = await connect(TemporalSettings(address=lv.stack.temporal.address), wait_s=20)
        view = await ops.scale(lv.client, "keep", 3)
        assert view.replicas == 3 and len(view.instances) >= 2
        await lv.wait(lambda: list(lv.states("keep").values()) == ["running"] * 3, 90, "3 RUNNING after restart")
        after = {i.name: i.pid for i in lv.instances("keep")}
        assert {k: after[k] for k in pids} == pids  # the first two were never restarted
        assert all(alive(lv, "h1", n) for n in after)
    finally:
        lv.close()


async def test_bad_input_is_named_and_the_system_keeps_working(tmp_path):
    """A launch command that fails at once: ERROR with the reason, restarted with backoff. A
    model whose files are on no host: PENDING naming the path. An invalid spec or replicas < 0: a
    clear CLI error (exit 2). Meanwhile a good deployment still reaches RUNNING."""
    lv = await Live(str(tmp_path)).start({"h1": [24, 24]})
    try:
        await ops.deploy(lv.client, spec("nobin", command="/no/such/server --port {port}"), FAST)
        await ops.deploy(lv.client, spec("crashy", command="python3 -c 'import sys; sys.exit(7)'"), FAST)
        nofiles = spec("nofiles").model_dump(mode="json", exclude_none=True)
        del nofiles["resources"]
        from scheduler.spec import ModelSpec

        await ops.deploy(lv.client, ModelSpec.model_validate(nofiles), FAST)
        await ops.deploy(lv.client, spec("good", vram_gib=4), FAST)
        await ops.deploy(lv.client, spec("portless", vram_gib=4, command="sleep 600"), FAST)  # up once it lived 0.5 s
        await lv.wait(lambda: lv.states("good") == {"good-0": "running"}, 60, "good RUNNING")
        await lv.wait(lambda: lv.states("portless") == {"portless-0": "running"}, 60, "portless RUNNING")

        def reason(n):
            return next(i for i in lv.instances() if i.name == n)

        await lv.wait(lambda: reason("nobin-0").restarts >= 2 and "cannot start '/no/such/server'" in
                      reason("nobin-0").reason, 30, "nobin ERROR with the reason, restarted twice", every=0.1)
        assert reason("nobin-0").worker == "h1"  # restarts stay on the same host
        await lv.wait(lambda: "exited with code 7" in reason("crashy-0").reason, 30, "crashy ERROR", every=0.1)
        await lv.wait(lambda: reason("nofiles-0").state == "pending", 30, "nofiles PENDING")
        assert "model path '/models/nofiles' is on no host that could run it: h1: " in reason("nofiles-0").reason

        bad = tmp_path / "bad.yaml"
        bad.write_text("name: x\nsource: {local_path: /m}\nbackend: tensorrt\n")
        out = cli(lv, "deploy", str(bad))
        assert out.returncode == 2 and "backend" in out.stderr and "tensorrt" in out.stderr, out.stderr
        out = cli(lv, "scale", "good", "-1")
        assert out.returncode == 2 and "replicas must be >= 0" in out.stderr, out.stderr
        out = cli(lv, "scale", "ghost", "2")
        assert out.returncode == 2 and "no deployment named 'ghost'" in out.stderr, out.stderr
        assert lv.states("good") == {"good-0": "running"}
    finally:
        lv.close()


async def test_pending_proceeds_when_a_host_joins_and_history_stays_bounded(tmp_path):
    """The server is told to suggest continue-as-new after 40 history events. A 30 GiB replica
    does not fit a 24 GiB GPU: PENDING with the numbers. A host with an 80 GiB GPU joins: the
    replica runs there at once (no periodic scan: pending_recheck_s is 120 s). A crash-looping
    instance and a deployment scaled up and down many times continue as new and carry on."""
    lv = Live(str(tmp_path))
    lv.stack.temporal.extra += ["--dynamic-config-value", "limit.historyCount.suggestContinueAsNew=40"]
    await lv.start({"small": [24]})
    try:
        await ops.deploy(lv.client, spec("wide", vram_gib=30), FAST)
        # the row start_instances writes is PENDING too, without a reason: wait for the decision's
        await lv.wait(lambda: lv.states("wide") == {"wide-0": "pending"} and lv.instances("wide")[0].reason, 30,
                      "wide PENDING with its reason")
        assert "30.0 GiB" in lv.instances("wide")[0].reason
        lv.add_host("big", [80])
        await lv.wait(lambda: lv.states("wide") == {"wide-0": "running"}, 30, "wide RUNNING on the new host")
        assert lv.instances("wide")[0].worker == "big"

        await ops.deploy(lv.client, spec("loop", vram_gib=1, command="python3 -c 'raise SystemExit(3)'"), FAST)
        await lv.wait(lambda: any(i.restarts >= 6 for i in lv.instances("loop")), 90, "6 restarts")
        for n in range(1, 10):  # 2, 1, 2, ..., 2
            await ops.scale(lv.client, "wide", 1 + n % 2)
        await lv.wait(lambda: list(lv.states("wide").values()) == ["running"] * 2, 60, "wide back to 2 RUNNING")

        async def runs(wid: str) -> int:
            return len([w async for w in lv.client.list_workflows(f"WorkflowId = '{wid}'")])

        await asyncio.sleep(1.5)  # visibility is eventually consistent
        assert await runs("deployment/wide") >= 2
        assert await runs("instance/loop-0") >= 2
        view = await ops.instance(lv.client, "loop-0")
        assert view.restarts >= 6  # the count survived continue-as-new
        assert view.decision is not None and view.decision.plan.worker == view.worker  # explain still answers
        assert (await lv.client.get_workflow_handle("deployment/wide").describe()).status.name == "RUNNING"
    finally:
        lv.close()


async def test_terminated_instance_is_cleaned_up_and_replaced(tmp_path):
    """An operator terminates an instance's workflow from the UI or CLI: no teardown ran. The
    deployment notices within reconcile_s, releases its reservation, stops its process on the
    host, and starts a replacement."""
    lv = await Live(str(tmp_path)).start({"h1": [24]})
    try:
        await ops.deploy(lv.client, spec("term", vram_gib=20), FAST)  # 20 GiB: the replacement needs the room back
        await lv.wait(lambda: lv.states("term") == {"term-0": "running"}, 60, "RUNNING")
        # the reconcile asks visibility which are running, one query for many (a describe each before);
        # a bad name never reaches the query
        from activities.records import listed_running

        assert await listed_running(lv.client, ["term-0", "term-9", "x') OR (1=1"]) == {"term-0"}
        await lv.client.get_workflow_handle("instance/term-0").terminate("operator")
        await lv.wait(lambda: lv.states("term") == {"term-1": "running"}, 60, "replacement RUNNING")
        old = next(i for i in lv.instances("term") if i.name == "term-0")
        assert old.state == "deleted" and "TERMINATED" in old.reason
        assert not alive(lv, "h1", "term-0")
        assert ledger.booked_per_gpu(lv.engine) == {("h1", 0): 20 * 2**30}  # only the replacement's
    finally:
        lv.close()
