"""Servers listen on the agent's advertised address (so a gateway on another host reaches them),
and readiness and liveness probe that address, not loopback."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.testing import ActivityEnvironment

from worker_agent.activities import HostActivities
from worker_agent.health import engine_answers
from worker_agent.bookings import HeldBookings
from worker_agent.engines import EngineConfig, argv_for
from contracts.agent import LaunchRequest
from worker_agent.processes import ProcessTable, build_argv

EXES = EngineConfig(allow_custom=True, vllm="/bin/true", sglang_python="/bin/true", llama_server="/bin/true")


def req(backend: str, **kw) -> LaunchRequest:
    return LaunchRequest(instance="m-0", model="m", backend=backend, model_path="/models/m", gpu_indexes=[0], **kw)


@pytest.mark.parametrize("r,cfg", [
    (req("vllm"), EXES),
    (req("sglang"), EXES),
    (req("llama.cpp"), EXES),
    (req("llama.cpp"), EngineConfig(llama_cpp_python="/bin/true")),  # llama-cpp-python's server too
])
def test_servers_listen_on_the_advertised_address(r, cfg):
    argv = argv_for(r, 8000, cfg, "10.0.0.2")
    assert argv[argv.index("--host") + 1] == "10.0.0.2"
    assert "127.0.0.1" not in argv


@pytest.mark.parametrize("command,host,argv", [
    ("srv --bind {host} --port {port}", "10.0.0.2", ["srv", "--bind", "10.0.0.2", "--port", "8000"]),
    ("srv --listen={host}:{port}", "127.0.0.1", ["srv", "--listen=127.0.0.1:8000"]),  # inside a word
])
def test_custom_commands_are_told_the_host(command, host, argv):
    assert build_argv(command, 8000, None, [], host=host) == argv
    assert argv_for(req("custom", run_command=command), 8000, EXES, host) == argv


async def test_readiness_and_liveness_probe_the_advertised_address(tmp_path):
    """A server bound to 127.0.0.2 only (another loopback address: loopback is 127/8 on Linux)
    is RUNNING through the agent, which must probe 127.0.0.2: 127.0.0.1 refuses."""
    table = ProcessTable(str(tmp_path / "agent"))
    acts = HostActivities("h", table, discover=lambda: None, address="127.0.0.2", poll_s=0.1,
                          bookings=HeldBookings({"srv-0": []}), engines=EngineConfig(allow_custom=True))
    r = LaunchRequest(instance="srv-0", model="srv", backend="custom", ready_timeout_s=20,
                      run_command="python3 -m http.server {port} --bind {host}")
    res = await ActivityEnvironment().run(acts.launch_instance, r)
    try:
        assert res.address == "127.0.0.2"
        assert await engine_answers(res.port, "custom", address="127.0.0.2")
        assert not await engine_answers(res.port, "custom", address="127.0.0.1")  # not on loopback's .1
        # liveness: the agent's supervision keeps probing the same address, so the server stays up
        acts.supervision.release("srv-0")
        acts.supervision.supervise(r.model_copy(update={"liveness_s": 0.2, "liveness_failures": 2}), table.find("srv-0"))
        await asyncio.sleep(1.5)  # 7 probes, 2 misses in a row would have stopped it
        assert acts.supervision.supervising("srv-0") and table.alive(res.pid) and not acts.supervision.ended
        acts.supervision.close()
    finally:
        await table.stop("srv-0", 2)
