"""The agent supervises the processes it launched or adopted itself (worker_agent/supervision.py),
and its watch carries their ends (contracts/process_end.py). The real activities, a real process
table, real processes; the host workflow's side is tests/test_supervision_live.py."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal

import pytest
from pydantic import ValidationError
from temporalio.testing import ActivityEnvironment

from contracts import agent as p
from contracts.host import HostReport
from contracts.host_auth import WatchAsk
from contracts.process_end import EndRef, ProcessEnd
from worker_agent.activities import HostActivities
from worker_agent.bookings import HeldBookings
from worker_agent.engines import EngineConfig
from worker_agent.processes import ProcessTable

SLEEP = "python3 -c 'import time; time.sleep(60)'"
EXIT3 = "python3 -c 'import sys, time; time.sleep(0.5); print(\"bye\"); sys.exit(3)'"
SERVER = "python3 -m http.server {port} --bind {host}"
REPORT = HostReport(name="h1", ram_total=2**30)


def agent(folder: str, grace: float = 10.0) -> HostActivities:
    return HostActivities("h1", ProcessTable(folder), lambda: REPORT, bookings=HeldBookings({"m-0": []}),
                          engines=EngineConfig(allow_custom=True), stop_grace_s=grace, poll_s=0.1)


def req(command: str, **kw) -> p.LaunchRequest:
    return p.LaunchRequest(instance="m-0", model="m", backend="custom", run_command=command, settle_s=0.1,
                           ready_timeout_s=20, **kw)


async def until(check, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("not within the time")


async def watch(acts: HostActivities, acked: list[EndRef] = ()) -> HostReport:
    raw = await ActivityEnvironment().run(acts.watch_host, WatchAsk(known=REPORT.fingerprint(), nonce="n1",
                                                                   acked=list(acked)))
    return HostReport.model_validate(raw)


async def test_an_exit_is_carried_by_the_watch_until_acknowledged(tmp_path):
    acts = agent(str(tmp_path))
    res = await ActivityEnvironment().run(acts.launch_instance, req(EXIT3))
    assert acts.supervision.supervising("m-0")  # a launch is supervised with no activity of its own
    await until(lambda: "m-0" in acts.supervision.ended)
    end = acts.supervision.ended["m-0"]
    assert (end.key, end.pid, end.returncode) == ("m-0", res.pid, 3)
    assert end.reason.startswith("exited with code 3") and "bye" in end.reason
    assert acts.table.find("m-0") is None  # forgotten by the table, as a supervisor did
    report = await watch(acts)
    assert report.ended == [end] and report.fingerprint() == REPORT.fingerprint()  # news, not an inventory change
    assert (await watch(acts)).ended == [end]  # not acknowledged: carried again
    assert (await watch(acts, [EndRef(key="m-0", pid=res.pid + 1)])).ended == [end]  # another pid's ack
    assert (await watch(acts, [end.ref()])).ended is None  # acknowledged: forgotten


async def test_a_stop_asked_for_is_no_news_and_the_agent_end_leaves_processes(tmp_path):
    acts = agent(str(tmp_path), grace=2)
    a = await ActivityEnvironment().run(acts.launch_instance, req(SLEEP))
    assert await ActivityEnvironment().run(acts.stop_instance, "m-0")
    await asyncio.sleep(0.3)
    assert not acts.table.alive(a.pid) and acts.supervision.ended == {}  # the instance knows: it asked
    b = await ActivityEnvironment().run(acts.launch_instance, req(SLEEP))
    acts.supervision.close()  # the agent stops (SIGTERM): its processes stay for the next run
    await asyncio.sleep(0.3)
    assert acts.table.alive(b.pid) and not acts.supervision.supervising("m-0")

    again = agent(str(tmp_path), grace=2)  # the next agent run adopts it from its pid file
    assert not again.supervision.supervising("m-0")
    assert await ActivityEnvironment().run(again.supervise_instance, req(SLEEP)) is None
    assert again.supervision.supervising("m-0")
    os.kill(b.pid, signal.SIGKILL)
    await until(lambda: "m-0" in again.supervision.ended)
    assert again.supervision.ended["m-0"].reason.startswith("ended (adopted from an earlier agent run")
    assert again.supervision.ended["m-0"].returncode == -1


async def test_a_process_gone_while_no_agent_watched_is_answered_at_once(tmp_path):
    acts = agent(str(tmp_path))
    gone = await ActivityEnvironment().run(acts.supervise_instance, req(SLEEP))
    assert gone == p.ExitReport(reason="the process is not running on this host")
    part = req(SLEEP).model_copy(update={"part": "rpc0", "role": "rpc-server"})
    gone = await ActivityEnvironment().run(acts.supervise_instance, part)
    assert gone.reason == "rpc-server rpc0 on h1: the process is not running on this host"


async def test_a_server_failing_its_health_check_is_stopped_and_reported(tmp_path):
    acts = agent(str(tmp_path), grace=0.5)
    res = await ActivityEnvironment().run(acts.launch_instance, req(SERVER, liveness_s=0.2, liveness_failures=2))
    await asyncio.sleep(0.6)  # it answers: no miss
    assert acts.supervision.supervising("m-0") and not acts.supervision.ended
    os.kill(res.pid, signal.SIGSTOP)  # alive, answering nothing
    try:
        await until(lambda: "m-0" in acts.supervision.ended)
    finally:
        with contextlib.suppress(ProcessLookupError):  # killed and reaped by then, as it should be
            os.kill(res.pid, signal.SIGCONT)
    end = acts.supervision.ended["m-0"]
    assert end.reason == f"failed its health check 2 times in a row (port {res.port}); stopped"
    assert end.returncode is None
    await until(lambda: not acts.table.alive(res.pid))


async def test_a_fault_of_the_supervision_itself_is_no_end(tmp_path):
    acts = agent(str(tmp_path), grace=0.5)
    r = req(SERVER, liveness_s=0.2, liveness_failures=2)
    res = await ActivityEnvironment().run(acts.launch_instance, r)
    calls = []

    async def flaky(req, rec) -> bool:  # the first probe raises (a bug, say), the next ones answer
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the probe broke")
        return True

    acts.supervision.probe = flaky
    acts.supervision.release("m-0")
    acts.supervision.supervise(r, acts.table.find("m-0"))
    await until(lambda: len(calls) >= 3)  # it went on, a second after the fault
    assert acts.supervision.supervising("m-0") and not acts.supervision.ended
    os.kill(res.pid, signal.SIGKILL)
    await until(lambda: "m-0" in acts.supervision.ended)
    assert acts.supervision.ended["m-0"].returncode == -9


@pytest.mark.parametrize("raw, problem", [
    ({"key": "../etc", "pid": 1}, "instance name '../etc'"),  # a key arrives through Temporal: a name or nothing
    ({"key": "m-0@a/b", "pid": 1}, "helper part name 'a/b'"),
    ({"key": "m-0", "pid": -1}, "greater than or equal to 0"),
    ({"key": "m-0", "pid": 1, "reason": "x" * 2001}, "at most 2000 characters"),
])
def test_a_process_end_that_is_not_one_is_refused(raw, problem):
    with pytest.raises(ValidationError, match=re.escape(problem)):
        ProcessEnd.model_validate(raw)
