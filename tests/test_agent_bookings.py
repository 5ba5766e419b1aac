"""No engine runs without its booking: the agent's launch activity asks the ledger (here an
in-memory one behind the same seam) which of this host's GPUs the instance holds, and starts no
process otherwise. The real activity, a real process table, real processes."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from contracts import agent as p
from worker_agent.activities import HostActivities
from worker_agent.bookings import HeldBookings
from worker_agent.engines import EngineConfig
from worker_agent.processes import ProcessTable

SLEEP = "python3 -c 'import time; time.sleep(30)'"


def agent(tmp_path, held: dict[str, list[int]]) -> HostActivities:
    return HostActivities("h1", ProcessTable(str(tmp_path)), lambda: None, bookings=HeldBookings(held),
                          engines=EngineConfig(allow_custom=True))


@pytest.mark.parametrize("held, key, gpus, named", [
    ({}, "m-0", [0], "no booking in the ledger for instance m-0 on host h1"),  # a ghost: nothing booked
    ({"other-0": [0]}, "m-0", [0], "no booking in the ledger for instance m-0"),  # GPU 0 is another's
    ({"m-0": [1]}, "m-0", [0, 1], "asks for GPU(s) 0 of host h1, which the ledger did not book for it (booked: 1)"),
    ({"m-0": []}, "m-0", [0], "asks for GPU(s) 0"),  # booked CPU only
    ({}, "m-0@rpc0", [2], "no booking in the ledger for instance m-0"),  # a helper belongs to its instance
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
