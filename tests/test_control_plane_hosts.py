"""The control plane end to end, its hosts' side: a Temporal outage, a host killed or cut off, an
agent restarted, a host's inventory changing. The real Temporal dev server, control-plane and agent
processes, real instance processes (python3 -m http.server), the store on SQLite. The deployments'
side (deploy, scale, delete, bursts, restarts of the control plane) is tests/test_control_plane.py."""

from __future__ import annotations

import asyncio
import os
import signal

from store import ledger
from gpuflow import ops
from tests.live import FAST, Live, spec
from tests.test_control_plane import alive


async def test_after_a_temporal_outage_a_host_is_ready_again_at_once(tmp_path):
    """Temporal down for longer than the heartbeat timeout: the host's watch fails when it is back,
    and the host is NOT_READY. Its agent still polls, so the probe that follows at once finds it:
    READY again within seconds, not after host_schedule_to_start_s (30 s here), while its replica
    stays RUNNING with the same process.

    The agent is held (SIGSTOP) through the outage and until the host is NOT_READY: a watch whose
    agent heartbeats again the moment Temporal is back can beat the server's overdue heartbeat
    timer (on a loaded machine it did), and then nothing fails at all. Held, its watch surely
    times out; let go, it answers the probe sent at once."""
    import time

    from store import records

    t = FAST.model_copy(update={"host_schedule_to_start_s": 30, "unreachable_grace_s": 300})
    lv = await Live(str(tmp_path), t=t).start({"h1": [24]})
    try:
        await ops.deploy(lv.client, spec("calm"), t)
        await lv.wait(lambda: lv.states("calm") == {"calm-0": "running"}, 60, "RUNNING")
        pid = lv.instances("calm")[0].pid
        agent = lv.stack.agents["h1"]
        agent.send_signal(signal.SIGSTOP)
        try:
            lv.stack.temporal.stop()
            await asyncio.sleep(2 * t.host_heartbeat_s + 1)
            lv.stack.temporal.start()

            def state() -> str:
                return {w.name: w.state for w in records.workers(lv.engine)}["h1"]

            await lv.wait(lambda: state() == "not_ready", 30, "h1 NOT_READY (its watch missed its heartbeats)",
                          every=0.1)
        finally:
            agent.send_signal(signal.SIGCONT)
        back = time.monotonic()
        await lv.wait(lambda: state() == "ready", 20, "h1 READY again", every=0.1)
        assert time.monotonic() - back < 20  # the first probe waited 30 s before
        await lv.wait(lambda: lv.states("calm") == {"calm-0": "running"}, 60, "still RUNNING")
        assert lv.instances("calm")[0].pid == pid
    finally:
        lv.close()


async def test_host_killed_instances_move_elsewhere(tmp_path):
    """h1 dies (agent and its processes SIGKILLed). Its instance goes UNREACHABLE, and after the
    grace period (3 s here) its reservation is released and it runs on h2. h1 is NOT_READY."""
    lv = await Live(str(tmp_path)).start({"h1": [24], "h2": [24]})
    try:
        await ops.deploy(lv.client, spec("mover", replicas=2, vram_gib=12), FAST)
        await lv.wait(lambda: list(lv.states("mover").values()) == ["running"] * 2, 60, "2 RUNNING")
        # make room on h2 for the one that must move: 12 + 12 = 24 fits one GPU of 24 GiB
        on_h1 = next(i for i in lv.instances("mover") if i.worker == "h1")
        seen = set()

        def watch():
            seen.update(i.state for i in lv.instances("mover") if i.name == on_h1.name)

        lv.stack.kill_host("h1")
        await lv.wait(lambda: "unreachable" in seen, 30, f"{on_h1.name} UNREACHABLE", check=watch, every=0.1)
        await lv.wait(lambda: next(i for i in lv.instances("mover") if i.name == on_h1.name).worker == "h2"
                      and lv.states("mover")[on_h1.name] == "running", 60, f"{on_h1.name} RUNNING on h2", check=watch)
        assert ledger.booked_per_gpu(lv.engine) == {("h2", 0): 24 * 2**30}  # h1's line released
        from store import records

        await lv.wait(lambda: {w.name: w.state for w in records.workers(lv.engine)}["h1"] == "not_ready", 30,
                      "h1 NOT_READY")
        assert alive(lv, "h2", on_h1.name)
    finally:
        lv.close()


async def test_agent_restart_adopts_its_running_processes(tmp_path):
    """The agent is stopped (SIGTERM) and started again on the same host: the server process it
    had started keeps running, the new agent adopts it (same pid), and the instance is RUNNING;
    a stop afterwards still stops that process. (A grace of 30 s: a loaded machine may take more
    than FAST's 3 s to start the agent again.)"""
    t = FAST.model_copy(update={"unreachable_grace_s": 30})
    lv = await Live(str(tmp_path), t=t).start({"h1": [24]})
    try:
        await ops.deploy(lv.client, spec("steady", vram_gib=4), t)
        await lv.wait(lambda: lv.states("steady") == {"steady-0": "running"}, 60, "RUNNING")
        pid = lv.instances("steady")[0].pid
        agent = lv.stack.agents.pop("h1")
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(30) == 0
        assert alive(lv, "h1", "steady-0")  # the agent's exit left the server running
        lv.add_host("h1", [24])

        def new_agent_serves() -> bool:
            with open(os.path.join(lv.stack.log_dir, "agent-h1.log")) as f:
                return f.read().count("serving gpuflow-host-h1") == 2

        await lv.wait(lambda: new_agent_serves() and lv.states("steady") == {"steady-0": "running"} and
                      lv.instances("steady")[0].pid == pid, 60, "the new agent serving; adopted, RUNNING")
        await asyncio.sleep(2 * FAST.host_heartbeat_s)  # supervised again: no restart happens
        row = lv.instances("steady")[0]
        assert (row.state, row.pid, row.restarts) == ("running", pid, 0)

        # a changed spec rolls the instances: steady-1 starts with the new spec, then steady-0 stops
        await ops.deploy(lv.client, spec("steady", vram_gib=6, env={"OMP_NUM_THREADS": "2"}), t)
        await lv.wait(lambda: lv.states("steady") == {"steady-1": "running"}, 60, "rolled to the new spec")
        assert lv.stack.instance_processes("h1").returncode(pid) is not None  # gone (or a zombie nobody reaped)
        assert ledger.booked_per_gpu(lv.engine) == {("h1", 0): 6 * 2**30}
        await ops.delete(lv.client, "steady", wait=True)
        assert not alive(lv, "h1", "steady-1")
    finally:
        lv.close()


async def test_cut_off_host_comes_back_and_stops_its_leftover(tmp_path):
    """Only h1's agent dies (a network split, as the control plane sees it): its server keeps
    running. The instance goes UNREACHABLE and, after the grace, runs on h2. When h1's agent
    comes back it finds the leftover process of an instance no longer placed there, and stops it."""
    lv = await Live(str(tmp_path)).start({"h1": [24], "h2": [24]})
    try:
        await ops.deploy(lv.client, spec("split", replicas=1, vram_gib=20), FAST)
        await lv.wait(lambda: lv.states("split") == {"split-0": "running"}, 60, "RUNNING")
        first = lv.instances("split")[0].worker
        other = "h2" if first == "h1" else "h1"
        leftover = lv.stack.instance_processes(first).find("split-0")
        lv.stack.kill_host(first, processes=False)
        await lv.wait(lambda: lv.instances("split")[0].worker == other and lv.states("split")["split-0"] == "running",
                      60, f"split-0 RUNNING on {other}")
        assert lv.stack.instance_processes(first).alive(leftover.pid)  # still running on the cut-off host
        lv.add_host(first, [24])
        await lv.wait(lambda: lv.stack.instance_processes(first).returncode(leftover.pid) is not None, 30,
                      "the leftover stopped by the returning agent")
        assert lv.states("split") == {"split-0": "running"} and alive(lv, other, "split-0")
    finally:
        lv.close()


async def test_inventory_changes_and_model_files_reach_the_scheduler(tmp_path):
    """A GPU added to a host's inventory shows in the store within seconds (the agent's watch
    returns on change); a host where an instance came up is recorded as holding its model files
    (downloaded from a local Hugging Face mirror), which the locality scorer reads."""
    from store.snapshot import load_snapshot
    from tests.hub_mirror import HubMirror
    from tests.live import write_inventory

    mirror = HubMirror({"org/loc": {"config.json": b"{}"}})
    lv = await Live(str(tmp_path), env={"HF_HUB_OFFLINE": "0"}).start({"h1": [24]},
                                                                        agent_args=["--hf-endpoint", mirror.url])
    try:
        await ops.deploy(lv.client, spec("loc", vram_gib=4, source={"huggingface": {"repo": "org/loc"}}), FAST)
        await ops.deploy(lv.client, spec("path", vram_gib=4), FAST)  # a local path: not recorded
        await lv.wait(lambda: lv.states() == {"loc-0": "running", "path-0": "running"}, 60, "RUNNING")
        files = load_snapshot(lv.engine).model_files
        assert [(f.worker, f.source, f.state.value) for f in files] == [("h1", "huggingface:org/loc", "ready")]

        from store import records

        write_inventory(str(tmp_path / "h1.yaml"), [24, 48])
        await lv.wait(lambda: len(records.workers(lv.engine)[0].gpus) == 2, 20, "the new GPU in the store")
        assert records.workers(lv.engine)[0].gpus[1]["vram_total"] == 48 * 2**30
        assert lv.states() == {"loc-0": "running", "path-0": "running"}  # nothing else moved
    finally:
        lv.close()
        mirror.close()
