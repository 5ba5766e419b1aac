"""The agent's launch activity gives each server its engine key, and its probes show it (issue 40):
real processes through the real activity, with a host credential. The demo's real engine
(llama-cpp-python's server with SmolLM2, which guards even /v1/models and has no /health) becomes
ready only because the readiness probe shows the key, and answers 401 without it; a stand-in
custom engine started by a restarted agent's table is adopted with the same key."""

from __future__ import annotations

import os
import sys

import httpx2 as httpx
from temporalio.testing import ActivityEnvironment

from contracts import agent as p
from contracts import credential as cr, launch_proof
from worker_agent.activities import HostActivities
from worker_agent.health import engine_answers
from worker_agent.bookings import HeldBookings
from worker_agent.credential import HostCredential
from worker_agent.engines import EngineConfig
from worker_agent.processes import ProcessTable

STANDIN = f"{sys.executable} {os.path.dirname(os.path.abspath(__file__))}/standin_engine.py --port {{port}} --host {{host}}"


def credential() -> HostCredential:
    cluster = cr.public_of(bytes(range(32)))
    return HostCredential(name="h1", public=cr.public_of(bytes(range(32, 64))),
                          key=cr.host_key(bytes(range(32, 64)), cluster), proof="", cluster=cluster)


def agent(folder: str, engines: EngineConfig) -> HostActivities:
    return HostActivities("h1", ProcessTable(folder), lambda: None, bookings=HeldBookings({"m-0": []}),
                          engines=engines, credential=credential(), poll_s=0.1)


async def test_llama_cpp_python_serving_smollm2_answers_only_its_key(tmp_path, smollm2):
    acts = agent(str(tmp_path), EngineConfig(llama_cpp_python=sys.executable))
    req = p.LaunchRequest(instance="m-0", model="m", backend="llama.cpp", model_path=smollm2,
                          backend_parameters=["-c", "256"], ready_timeout_s=120)
    res = await ActivityEnvironment().run(acts.launch_instance, req)  # ready: its probe showed the key
    try:
        key = credential().engine_key("m-0", "", res.key_id)
        base = f"http://{res.address}:{res.port}"
        assert httpx.get(f"{base}/v1/models", timeout=10).status_code == 401
        assert httpx.get(f"{base}/v1/models", headers={"Authorization": "Bearer gfe-wrong"}, timeout=10).status_code == 401
        assert httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10).status_code == 200
        assert not await engine_answers(res.port, "llama.cpp", address=res.address)  # what a keyless probe would see
        assert await engine_answers(res.port, "llama.cpp", address=res.address, key=key)
        assert not any(key in w for w in res.argv)
    finally:
        await acts.stop_instance("m-0")


async def test_a_restarted_agent_adopts_the_engine_with_its_key(tmp_path):
    req = p.LaunchRequest(instance="m-0", model="m", backend="custom", run_command=STANDIN, ready_timeout_s=30)
    first = agent(str(tmp_path), EngineConfig(allow_custom=True))
    res = await ActivityEnvironment().run(first.launch_instance, req)
    try:
        key = credential().engine_key("m-0", "", res.key_id)
        url = f"http://{res.address}:{res.port}/v1/completions"
        ask = {"model": "m", "prompt": "x", "max_tokens": 1}
        assert httpx.post(url, json=ask, timeout=10).status_code == 401
        assert httpx.post(url, json=ask, headers={"Authorization": f"Bearer {key}"}, timeout=10).status_code == 200
        again = await ActivityEnvironment().run(agent(str(tmp_path), EngineConfig(allow_custom=True)).launch_instance,
                                                req)  # a new agent run, the same data folder
        assert (again.adopted, again.pid, again.key_id) == (True, res.pid, res.key_id)
        # the launch's result is the host's word, MACed with its key (contracts/launch_proof.py): the
        # control plane's check passes it, and the adopted process's result carries the same MAC
        fields = launch_proof.body("m-0", "", res.pid, res.port, res.address, res.key_id, res.kv_events_port)
        assert launch_proof.problem(credential().key, "h1", fields, res.mac) is None
        assert again.mac == res.mac
        assert launch_proof.problem(credential().key, "h1", {**fields, "port": res.port + 1}, res.mac)
    finally:
        await first.stop_instance("m-0")
