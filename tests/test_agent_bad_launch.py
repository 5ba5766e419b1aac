"""A launch request the OS or the agent refuses because of what the spec says (a NUL or '=' in
an env key or value, a run_command that cannot be split, a model path outside the host's roots)
is a non-retryable InvalidSpec naming the problem, never an error that reads as "host
unreachable". The real agent activity, a real process table, a real exec attempt."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from contracts.control import HostReport
from contracts import agent as p
from worker_agent.activities import HostActivities
from worker_agent.bookings import HeldBookings
from worker_agent.engines import EngineConfig
from worker_agent.processes import ProcessTable


def agent(tmp_path, **engines) -> HostActivities:
    return HostActivities("h1", ProcessTable(str(tmp_path)), lambda: HostReport(name="h1", ram_total=2**30),
                          bookings=HeldBookings({"m-0": []}), engines=EngineConfig(allow_custom=True, **engines))


@pytest.mark.parametrize("request_fields, named", [
    ({"env": {"BAD\0KEY": "1"}}, "no NUL"),  # refused by the agent's own check of the spec (check_launch)
    ({"env": {"A": "x\0y"}}, "holds a NUL byte"),
    ({"env": {"A=B": "1"}}, "no '='"),
    ({"run_command": "python3 -c 'print(1)"}, "No closing quotation"),
    ({"model_path": "/elsewhere/m"}, "outside this host's model roots"),
])
async def test_the_specs_fault_at_launch_is_invalid_spec(tmp_path, request_fields, named):
    req = p.LaunchRequest(**{"instance": "m-0", "model": "m", "backend": "custom", "settle_s": 0.1,
                             "run_command": "python3 -c 'import time; time.sleep(30)'", **request_fields})
    acts = agent(tmp_path, model_roots=(str(tmp_path),))
    with pytest.raises(ApplicationError) as e:
        await ActivityEnvironment().run(acts.launch_instance, req)
    assert e.value.type in ("InvalidSpec", "LaunchRefused") and e.value.non_retryable, (e.value.type, str(e.value))  # both: the spec's fault
    assert named in str(e.value)
    assert acts.table.records() == []  # nothing was left running or recorded


async def test_a_missing_engine_stays_launch_failed(tmp_path):
    """Not the spec's fault: another host may have the engine."""
    req = p.LaunchRequest(instance="m-0", model="m", backend="custom", run_command="true")
    with pytest.raises(ApplicationError) as e:
        await ActivityEnvironment().run(HostActivities(
            "h1", ProcessTable(str(tmp_path)), lambda: None, bookings=HeldBookings({"m-0": []}),
            engines=EngineConfig()).launch_instance, req)
    assert e.value.type == "LaunchFailed"
