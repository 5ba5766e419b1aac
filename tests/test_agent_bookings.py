"""No engine runs without its booking: the agent's launch activity asks the ledger (here an
in-memory one behind the same seam) which of this host's GPUs the instance holds, and starts no
process otherwise. The real activity, a real process table, real processes."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from contracts import agent as p
from contracts.host import BookedPart, Booking
from scheduler.units import GiB
from worker_agent.activities import HostActivities
from worker_agent.bookings import HeldBookings
from worker_agent.engines import EngineConfig
from worker_agent.processes import ProcessTable, pid_alive
from worker_agent.reconcile import stop_orphans, unbooked_verdict
from worker_agent.usage import UsageBook

SLEEP = "python3 -c 'import time; time.sleep(30)'"


def agent(tmp_path, held: dict[str, list[int] | Booking]) -> HostActivities:
    return HostActivities("h1", ProcessTable(str(tmp_path)), lambda: None, bookings=HeldBookings(held),
                          engines=EngineConfig(allow_custom=True))


@pytest.mark.parametrize("held, key, gpus, named", [
    ({}, "m-0", [0], "no booking in the ledger for instance m-0 on host h1"),  # a ghost: nothing booked
    ({"other-0": [0]}, "m-0", [0], "no booking in the ledger for instance m-0"),  # GPU 0 is another's
    ({"m-0": [1]}, "m-0", [0, 1], "asks for GPU(s) 0 of host h1, which the ledger did not book for it (booked: 1)"),
    ({"m-0": []}, "m-0", [0], "asks for GPU(s) 0"),  # booked CPU only
    ({}, "m-0@rpc0", [2], "no booking in the ledger for instance m-0"),  # a helper belongs to its instance
    ({"m-0": [0]}, "m-0@rpc0", [0], "no part 'rpc0' booked on host h1"),  # booked: its server alone
])
async def test_a_launch_outside_the_booking_starts_nothing(tmp_path, held, key, gpus, named):
    inst, _, part = key.partition("@")
    req = p.LaunchRequest(instance=inst, part=part, role="rpc-server" if part else "server", model="m",
                          backend="custom", run_command=SLEEP, gpu_indexes=gpus, settle_s=0.1)
    acts = agent(tmp_path, held)
    with pytest.raises(ApplicationError) as e:
        await ActivityEnvironment().run(acts.launch_instance, req)
    assert e.value.type == "NotBooked" and e.value.non_retryable
    assert named in str(e.value)
    assert acts.table.records() == []  # no process was started


@pytest.mark.parametrize("held, gpus", [
    ({"m-0": [0, 1]}, [0, 1]),  # exactly what was booked
    ({"m-0": [0, 1]}, [1]),  # a part of it
    ({"m-0": []}, []),  # CPU only, booked CPU only
])
async def test_a_launch_within_its_booking_starts(tmp_path, held, gpus):
    req = p.LaunchRequest(instance="m-0", model="m", backend="custom", run_command=SLEEP, gpu_indexes=gpus,
                          settle_s=0.1)
    acts = agent(tmp_path, held)
    res = await ActivityEnvironment().run(acts.launch_instance, req)
    try:
        assert acts.table.alive(res.pid)
    finally:
        await acts.stop_instance("m-0")


# --- one booking, one set of processes (issue 40, H2) ---------------------------------------------
# A vLLM replica over Ray as the ledger books it on its main host: its server and the Ray head on
# GPUs 0 and 1 (contracts/booked_parts.py); its Ray worker runs on the other host.
MAIN = Booking(booked=True, gpu_indexes=[0, 1], vram_claim={0: 20 * GiB, 1: 20 * GiB}, ram_claim=GiB,
               parts=[BookedPart(part="ray-head", role="ray-head", gpu_indexes=[0, 1]),
                      BookedPart(part="", role="server", gpu_indexes=[0, 1])])
RPC_HOST = Booking(booked=True, gpu_indexes=[0, 1], parts=[BookedPart(part="rpc0", role="rpc-server", gpu_indexes=[0]),
                                                           BookedPart(part="rpc1", role="rpc-server", gpu_indexes=[1])])


@pytest.mark.parametrize("booking, part, role, gpus, named", [
    (MAIN, "p9", "server", [0], "instance m-0 has no part 'p9' booked on host h1 (booked here: 'ray-head', '')"),
    (MAIN, "ray0", "ray-worker", [0], "has no part 'ray0' booked on host h1"),  # the worker's part is the other host's
    (RPC_HOST, "", "server", [0], "has no part '' booked on host h1 (booked here: 'rpc0', 'rpc1')"),  # no server here
    (MAIN, "ray-head", "server", [0, 1], "part 'ray-head' of instance m-0 is booked on host h1 as ray-head, not server"),
    (RPC_HOST, "rpc0", "rpc-server", [1], "instance m-0 (part rpc0) asks for GPU(s) 1 of host h1, which the ledger "
                                          "did not book for it (booked: 0)"),  # rpc1's GPU
])
async def test_only_the_parts_a_booking_names_start(tmp_path, booking, part, role, gpus, named):
    """The probe's case: a booked instance name with a new part ("p9") started 17 extra engines on
    that booking's GPUs. Any part, role or GPU the booking does not name is refused, naming it."""
    req = p.LaunchRequest(instance="m-0", part=part, role=role, model="m", backend="custom", run_command=SLEEP,
                          gpu_indexes=gpus, settle_s=0.1)
    acts = agent(tmp_path, {"m-0": booking})
    with pytest.raises(ApplicationError) as e:
        await ActivityEnvironment().run(acts.launch_instance, req)
    assert e.value.type == "NotBooked" and e.value.non_retryable and named in str(e.value), str(e.value)
    assert acts.table.records() == []


async def test_a_part_runs_at_most_once_and_a_relaunch_keeps_the_ledgers_claim(tmp_path):
    """A second (and third) launch of a live part adopts its process: one process per part, however
    often or however differently it is asked. Its measured memory is reported against the ledger's
    claim: a relaunch carrying an empty claim no longer wipes it."""
    acts = agent(tmp_path, {"m-0": MAIN})
    acts.usage = UsageBook(lambda procs: {})
    first = p.LaunchRequest(instance="m-0", model="m", backend="custom", run_command=SLEEP, gpu_indexes=[0, 1],
                            settle_s=0.1, vram_claim={0: 20 * GiB, 1: 20 * GiB}, ram_claim=GiB)
    a = await ActivityEnvironment().run(acts.launch_instance, first)
    try:
        again = first.model_copy(update={"vram_claim": {}, "ram_claim": 0, "run_command": SLEEP + " # another"})
        b = await ActivityEnvironment().run(acts.launch_instance, again)
        c = await ActivityEnvironment().run(acts.launch_instance, again.model_copy(update={"gpu_indexes": [1]}))
        assert (a.adopted, b.adopted, c.adopted) == (False, True, True) and a.pid == b.pid == c.pid
        assert [r.instance for r in acts.table.records()] == ["m-0"]
        kept = acts.usage.requests["m-0"]
        assert (kept.vram_claim, kept.ram_claim) == ({0: 20 * GiB, 1: 20 * GiB}, GiB)  # the ledger's, not {} and 0
    finally:
        await acts.stop_instance("m-0")


def stray(tmp_path, key: str) -> int:
    """A process the agent's table knows of that no launch of this agent started: its pid file
    written as an earlier agent run's launch (or an attacker with the data folder) would have."""
    other = ProcessTable(str(tmp_path))  # the same folder: the same pid files
    return other.start(key, ["python3", "-c", "import time; time.sleep(30)"], {}, None).pid


async def test_the_orphan_check_stops_every_process_no_booking_names(tmp_path):
    """The ledger books m-0's server and Ray head here. Kept: the server, launched through the
    booking check, and the Ray head (whoever started it: the ledger books that part here).
    Stopped at once: m-0@p9 (a part no booking names), ghost-0 (no booking at all) and m-0@ray0
    (a part booked on another host): none was ever seen booked here, so no workflow is asked.
    Before, the check asked only whether the instance was placed here."""
    acts = agent(tmp_path, {"m-0": MAIN})
    req = p.LaunchRequest(instance="m-0", model="m", backend="custom", run_command=SLEEP, gpu_indexes=[0, 1],
                          settle_s=0.1)
    kept = [(await ActivityEnvironment().run(acts.launch_instance, req)).pid, stray(tmp_path, "m-0@ray-head")]
    strays = {k: stray(tmp_path, k) for k in ("m-0@p9", "ghost-0", "m-0@ray0")}
    try:
        stopped = await stop_orphans(None, "h1", acts.table, stop_grace_s=2, bookings=acts.bookings)
        assert sorted((o.key, o.why) for o in stopped) == [("ghost-0", "unbooked"), ("m-0@p9", "unbooked"),
                                                           ("m-0@ray0", "unbooked")]
        assert "no booking in the ledger names part 'p9' of instance m-0 on this host" in \
            next(o.detail for o in stopped if o.key == "m-0@p9")
        assert not any(pid_alive(pid) for pid in strays.values())
        assert all(acts.table.alive(pid) for pid in kept)
        assert sorted(r.instance for r in acts.table.records()) == ["m-0", "m-0@ray-head"]
    finally:
        await acts.stop_instance("m-0")
        for k in strays:
            await acts.table.stop(k, 1)


@pytest.mark.parametrize("last_booked, workflow, verdict", [
    (None, None, "unbooked"),  # never seen booked by this agent run: stopped, no workflow asked
    (95.0, "gone", "gone"),  # its booking went; its workflow ended: stopped at once
    (95.0, "elsewhere", "elsewhere"),  # placed on another host now
    (95.0, "keep", "keep"),  # 100 - 95 = 5 s < 90: a preempted victim draining, its workflow still running it
    (95.0, "unknown", "keep"),  # its workflow does not answer: the wind-down still holds
    (10.0, "keep", "unbooked"),  # 100 - 10 = 90 s >= 90: whatever its workflow says, it is stopped
])
def test_a_process_whose_booking_went_is_wound_down_then_stopped(last_booked, workflow, verdict):
    """reconcile.unbooked_verdict at now = 100 s, wind_down_s = 90: a workflow can make a process
    stop sooner, never keep one that no booking names past the wind-down."""
    assert unbooked_verdict(last_booked, 100.0, 90.0, workflow) == verdict
