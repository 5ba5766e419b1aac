"""Lifecycle faults end to end, with the real stack (tests/live.py): an agent frozen with SIGSTOP
looks, to the control plane, like a host cut off while its processes keep running; SIGCONT
brings it back with the same process table and no restart."""

from __future__ import annotations

import asyncio
import signal
import time
import urllib.request


from gpuflow import ops
from tests.live import FAST, Live, spec
from contracts import agent as hp
from worker_agent import reconcile


def row(lv: Live, name: str):
    return next(i for i in lv.instances() if i.name == name)


def live_copies(lv: Live, instance: str) -> list[str]:
    """Hosts where a process of ``instance`` runs, from each agent's pid files."""
    out = []
    for host in ("h1", "h2"):
        t = lv.stack.instance_processes(host)
        r = t.find(instance)
        if r is not None and t.alive(r.pid):
            out.append(host)
    return out


async def test_a_second_unreachable_episode_gets_the_full_grace_period(tmp_path):
    """Two outages of the same host, far enough apart (more than a grace period of RUNNING in
    between): each is UNREACHABLE first and keeps the placement while the host is back within
    the grace (15 s here). The bug: the second outage skipped the grace and re-placed the instance
    on h2 at once, while its first process kept running on h1 (two live copies)."""
    t = FAST.model_copy(update={"unreachable_grace_s": 15})
    lv = await Live(str(tmp_path), t=t).start({"h1": [24], "h2": [24]})
    agent = None
    try:
        await ops.deploy(lv.client, spec("twice", vram_gib=20), t)
        await lv.wait(lambda: lv.states("twice") == {"twice-0": "running"}, 60, "RUNNING")
        first = row(lv, "twice-0")
        agent = lv.stack.agents[first.worker]
        moved: list[str] = []

        def watch():  # the placement must never leave the frozen host within its grace
            r = row(lv, "twice-0")
            if r.worker != first.worker or r.state == "pending":
                moved.append(f"{r.state}@{r.worker}: {r.reason}")
            assert not moved, moved

        for episode in (1, 2):
            agent.send_signal(signal.SIGSTOP)
            frozen = time.monotonic()
            await lv.wait(lambda: row(lv, "twice-0").state == "unreachable", 30,
                          f"episode {episode}: UNREACHABLE", check=watch, every=0.1)
            await asyncio.sleep(max(0.0, 8 - (time.monotonic() - frozen)))  # ~8 s out: half the grace
            watch()
            agent.send_signal(signal.SIGCONT)
            await lv.wait(lambda: (row(lv, "twice-0").state, row(lv, "twice-0").pid) == ("running", first.pid), 40,
                          f"episode {episode}: the same process adopted, RUNNING", check=watch)
            assert live_copies(lv, "twice-0") == [first.worker]
            if episode == 1:
                await asyncio.sleep(t.unreachable_grace_s + 3)  # RUNNING longer than a grace before the next outage
                watch()
        assert row(lv, "twice-0").restarts == 0
    finally:
        if agent is not None:
            agent.send_signal(signal.SIGCONT)
        lv.close()


def agent_log(lv: Live, host: str) -> str:
    with open(f"{lv.stack.log_dir}/agent-{host}.log") as f:
        return f.read()


def orphans_metric(lv: Live, host: str) -> float:
    text = urllib.request.urlopen(f"http://{lv.stack.metrics[f'agent {host}']}/metrics", timeout=10).read().decode()
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith("gpuflow_agent_orphans_stopped_total{"))


async def test_orphan_of_a_moved_placement_is_stopped_without_an_agent_restart(tmp_path):
    """h1's agent freezes past the grace (3 s): the instance is released and RUNNING on h2, while
    its first process still runs on h1. When h1's agent thaws (same process, never restarted),
    its periodic orphan check (every 2 s here) stops that process within the interval, logs it
    and counts it; one live copy remains. Before, only an agent start-up checked."""
    t = FAST.model_copy(update={"orphan_check_s": 2})
    lv = await Live(str(tmp_path), t=t).start({"h1": [24], "h2": [24]})
    agent = None
    try:
        await ops.deploy(lv.client, spec("mover", vram_gib=20), t)
        await lv.wait(lambda: lv.states("mover") == {"mover-0": "running"}, 60, "RUNNING")
        first = row(lv, "mover-0")
        other = "h2" if first.worker == "h1" else "h1"
        agent = lv.stack.agents[first.worker]
        agent.send_signal(signal.SIGSTOP)
        await lv.wait(lambda: row(lv, "mover-0").worker == other and row(lv, "mover-0").state == "running", 60,
                      f"mover-0 RUNNING on {other}")
        assert sorted(live_copies(lv, "mover-0")) == ["h1", "h2"]  # the leftover on the frozen host
        agent.send_signal(signal.SIGCONT)
        thawed = time.monotonic()
        await lv.wait(lambda: live_copies(lv, "mover-0") == [other], 30, "the leftover stopped by the running agent")
        print(f"leftover stopped {time.monotonic() - thawed:.1f} s after the agent thawed")
        assert agent.poll() is None and lv.stack.agents[first.worker] is agent  # no restart
        # the stop waits for the process to end, then logs and counts it: the copy can be gone a
        # moment before its count and its log line, so both are waited for, not read at once
        await lv.wait(lambda: orphans_metric(lv, first.worker) >= 1, 10,
                      "the stop counted")  # each stop counts (a late launch retry may be stopped too)
        await lv.wait(lambda: "stopped orphan mover-0" in agent_log(lv, first.worker), 10, "the stop logged")
        assert row(lv, "mover-0").state == "running" and row(lv, "mover-0").worker == other
    finally:
        if agent is not None:
            agent.send_signal(signal.SIGCONT)
        lv.close()


async def test_a_process_whose_instance_never_existed_is_stopped_as_unbooked(tmp_path):
    """A process in the agent's table (started the way the agent starts one: own session, pid
    file) whose instance the ledger never booked, beside a RUNNING instance's: the running agent
    stops the first within its interval (why=unbooked: no booking names it, and this agent run never
    saw it booked, so no workflow is asked) and leaves the second alone. The RUNNING one is kept on
    the ledger's one read per check (the host workflow's ``bookings`` update), not by asking its
    workflow. The visibility query the check falls back on when the ledger cannot be asked
    (reconcile.placed_here) lists it; a host name outside the name rule queries nothing."""
    t = FAST.model_copy(update={"orphan_check_s": 2})
    lv = await Live(str(tmp_path), t=t).start({"h1": [24]})
    try:
        await ops.deploy(lv.client, spec("kept", vram_gib=4), t)
        await lv.wait(lambda: lv.states("kept") == {"kept-0": "running"}, 60, "RUNNING")
        table = lv.stack.instance_processes("h1")
        ghost = table.start("ghost-0", ["sleep", "600"], {}, None)
        # stopped, then its pid file removed (the agent's stop removes it just after the process ends)
        await lv.wait(lambda: table.returncode(ghost.pid) is not None and table.find("ghost-0") is None, 30,
                      "ghost-0 stopped by the agent")
        assert live_copies(lv, "kept-0") == ["h1"]
        here = set()
        for _ in range(50):  # visibility follows the booking's upsert within moments
            here = await reconcile.placed_here(lv.client, "h1")
            if here:
                break
            await asyncio.sleep(0.2)
        assert here == {"kept-0"}
        assert await reconcile.placed_here(lv.client, "h2") == set()
        assert await reconcile.placed_here(lv.client, "h1' OR WorkflowType = 'x") == set()
        text = urllib.request.urlopen(f"http://{lv.stack.metrics['agent h1']}/metrics", timeout=10).read().decode()
        assert 'gpuflow_agent_orphans_stopped_total{host="h1",why="unbooked"} 1.0' in text
    finally:
        lv.close()


async def supervisor_on(lv: Live, instance: str, agent_pid: int) -> bool:
    """The agent process ``agent_pid`` (its identity) answered the instance's ``supervise_instance``:
    it supervises the instance's process (worker_agent/supervision.py)."""
    h = await lv.client.get_workflow_handle(f"instance/{instance}").fetch_history()
    asked = {e.event_id for e in h.events if e.HasField("activity_task_scheduled_event_attributes")
             and e.activity_task_scheduled_event_attributes.activity_type.name == hp.SUPERVISE_INSTANCE}
    by = {e.activity_task_started_event_attributes.scheduled_event_id for e in h.events
          if e.HasField("activity_task_started_event_attributes")
          and e.activity_task_started_event_attributes.scheduled_event_id in asked
          and e.activity_task_started_event_attributes.identity.startswith(f"{agent_pid}@")}
    return any(e.HasField("activity_task_completed_event_attributes")
               and e.activity_task_completed_event_attributes.scheduled_event_id in by for e in h.events)


async def killed_and_restarted(lv: Live, name: str, pid: int, within_s: float) -> None:
    """SIGKILL the server ``pid`` of ``name`` on h1: its host reports the end, and the replica runs a new one."""
    lv.stack.instance_processes("h1").signal_group(pid, signal.SIGKILL)
    await lv.wait(lambda: row(lv, name).state == "running" and row(lv, name).pid not in (None, pid),
                  within_s, "the server's death seen and the server started again")
    assert row(lv, name).restarts == 1


async def test_after_an_agent_restart_a_server_exit_is_seen_at_once(tmp_path):
    """The agent dies (SIGKILL; its server keeps running) and starts again. Its supervision died
    with it: the host's watch tells the instance (lost, restarted), and the instance asks the new
    agent run to supervise the server it adopted. When the server then dies, the new run's watch
    reports it and the instance starts it again within seconds."""
    t = FAST.model_copy(update={"unreachable_grace_s": 30})
    lv = await Live(str(tmp_path), t=t).start({"h1": [24]})
    try:
        await ops.deploy(lv.client, spec("again", vram_gib=4), t)
        await lv.wait(lambda: lv.states("again") == {"again-0": "running"}, 60, "RUNNING")
        first = row(lv, "again-0")
        lv.stack.kill_host("h1", processes=False)
        lv.add_host("h1", [24])
        agent = lv.stack.agents["h1"].pid
        for _ in range(200):  # supervised by the new agent run (60 s at most)
            if row(lv, "again-0").state == "running" and await supervisor_on(lv, "again-0", agent):
                break
            await asyncio.sleep(0.3)
        else:
            raise AssertionError(f"not supervised by the new agent: {row(lv, 'again-0')}")
        assert row(lv, "again-0").pid == first.pid  # adopted, not started again
        await killed_and_restarted(lv, "again-0", first.pid, 30)
    finally:
        lv.close()


async def test_ends_signalled_by_others_do_not_hide_the_real_one(tmp_path):
    """Anyone who reaches Temporal can signal ``host_news``: ends of processes the replica never ran
    (70, past its bound of 64) and one of its own key with another pid change nothing, and the real
    end, told by its host's signed report, still restarts it."""
    lv = await Live(str(tmp_path)).start({"h1": [24]})
    try:
        await ops.deploy(lv.client, spec("end", vram_gib=4), FAST)
        await lv.wait(lambda: lv.states("end") == {"end-0": "running"}, 60, "RUNNING")
        first = row(lv, "end-0")
        inst = lv.client.get_workflow_handle("instance/end-0")
        for i in range(70):
            await inst.signal("host_news", {"host": "h1", "kind": "exited", "key": f"ghost-{i}", "pid": 1})
        await inst.signal("host_news", {"host": "h1", "kind": "exited", "key": "end-0", "pid": first.pid + 1})
        await inst.signal("host_news", {"host": "h2", "kind": "exited", "key": "end-0", "pid": first.pid})
        await asyncio.sleep(3)
        again = row(lv, "end-0")
        assert (again.state, again.pid, again.restarts) == ("running", first.pid, 0)
        await killed_and_restarted(lv, "end-0", first.pid, 60)
    finally:
        lv.close()
