"""Agents report the engines they can run (worker_agent/capabilities.py) and the backend filter
places only there, end to end with the real stack (tests/live.py) and real engines: llama.cpp
through llama-cpp-python serving the SmolLM2 GGUF, custom commands only with --allow-custom."""

from __future__ import annotations

import os
import sys

from store import records
from gpuflow import ops
from gpuflow.ports import server_port
from scheduler.spec import ModelSpec
from tests.live import FAST, Live, spec, write_inventory


def add_plain_host(lv: Live, name: str, gpus: list[float], *extra: str) -> None:
    """An agent started as an operator would without --allow-custom (the dev stack's own agents
    always allow custom commands)."""
    inv = write_inventory(os.path.join(lv.tmp, f"{name}.yaml"), gpus)
    lv.stack.agents[name] = lv.stack._spawn(f"agent-{name}.log", "agent", "--name", name, "--inventory", inv,
                                            "--metrics-address", f"127.0.0.1:{server_port()}", *extra)


def backends(lv: Live) -> dict[str, list[str] | None]:
    return {w.name: w.backends for w in records.workers(lv.engine)}


async def test_llama_cpp_model_goes_to_the_host_that_has_llama_cpp(tmp_path, smollm2):
    """Two hosts, both with custom allowed: 'a' names a llama-server that does not exist, 'b' serves
    llama.cpp through llama-cpp-python. 'a' sorts first and is otherwise the same, yet the model
    runs on 'b', and the decision says why 'a' was left out."""
    lv = await Live(str(tmp_path)).start({"b": [24]}, agent_args=["--llama-cpp-python", sys.executable])
    try:
        lv.add_host("a", [24], ["--llama-server", str(tmp_path / "no-llama-server")])
        await lv.wait(lambda: backends(lv).get("a") is not None, 30, "host a reported")
        assert backends(lv) == {"a": ["custom"], "b": ["llama.cpp", "custom"]}
        smol = ModelSpec.model_validate({"name": "smol", "source": {"local_path": smollm2}, "backend": "llama.cpp",
                                         "backend_parameters": ["-c", "512"]})
        await ops.deploy(lv.client, smol, FAST)
        await lv.wait(lambda: lv.states("smol") == {"smol-0": "running"}, 120, "RUNNING")
        row = lv.instances("smol")[0]
        assert row.worker == "b"
        view = await ops.instance(lv.client, "smol-0")
        backend = next(f for f in view.decision.filters if f.filter == "backend")
        assert [r.model_dump() for r in backend.removed] == [{"worker": "a", "reasons": [
            "cannot run llama.cpp: no llama-server or llama-cpp-python found (it runs: custom)"]}]
    finally:
        lv.close()


async def test_custom_model_waits_for_a_host_that_allows_custom(tmp_path):
    """The only host's agent has no --allow-custom: the custom model stays PENDING with the reason
    and nothing is launched there. A host that allows custom joins: the model runs there."""
    lv = Live(str(tmp_path))
    try:
        lv.stack.start_temporal()
        lv.stack.start_server()
        add_plain_host(lv, "strict", [24])
        from gpuflow.runtime import connect
        from gpuflow.settings import TemporalSettings

        lv.client = await connect(TemporalSettings(address=lv.stack.temporal.address), wait_s=20)
        await lv.wait(lambda: backends(lv).get("strict") == [], 30, "strict reported, with no engine")
        await ops.deploy(lv.client, spec("mine", vram_gib=4), FAST)
        why = "worker strict: cannot run custom: custom run commands need gpuflow agent --allow-custom"
        await lv.wait(lambda: any(why in i.reason for i in lv.instances("mine")), 60, "PENDING with the reason")
        assert lv.states("mine") == {"mine-0": "pending"}
        assert lv.stack.instance_processes("strict").records() == []
        lv.add_host("open", [24])  # the dev stack's agent: --allow-custom
        await lv.wait(lambda: lv.states("mine") == {"mine-0": "running"}, 60, "RUNNING on the host that allows it")
        assert lv.instances("mine")[0].worker == "open"
        assert lv.stack.instance_processes("strict").records() == []
    finally:
        lv.close()
