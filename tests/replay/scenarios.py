"""The scenarios the replay corpus is recorded from (record.py), one stack each: what the cluster
holds, what is driven, and what "settled" means. Each driver waits for an outcome it can check in
the store or a query, never for a fixed time, so a slow machine records the same paths, only
later. Small on purpose: the histories are committed (a few replicas, tests/live.py FAST timings).

- deploy: 2 replicas start, then the deployment is deleted (closed histories, the delete path).
- scale: 1 -> 3 -> 1 (the cluster-wide scale-down ranking, instances stopped).
- rollout: a spec change rolled surge-first onto a spare GPU and baked, then ``rollout undo`` back.
- preemption: a tenant with a guarantee takes a GPU back from a lower-priority borrower.
- host_loss: a host dies with its processes; its replica goes UNREACHABLE and moves.
- autoscale: an ``autoscaling`` block whose min_replicas the autoscaler applies, and a few steps.
- config: the cluster workflow's updates (tenants applied, a key made and revoked), and reads (queries
  of the cluster-reads workflow: nothing of them is in a history)."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, NamedTuple

from gpuflow import ops
from scheduler.tenancy.config import TenantsFile
from store import records, tenants
from tests.live import ECHO, FAST, Live, spec
from workflows.deployment import ModelDeploymentWorkflow

T = FAST


class Scenario(NamedTuple):
    hosts: dict[str, list[float]]  # host name -> its simulated GPUs (GiB)
    drive: Callable[[Live], Awaitable[None]]


def running(lv: Live, dep: str) -> list[str]:
    return sorted(n for n, s in lv.states(dep).items() if s == "running")


async def deploy(lv: Live) -> None:
    await ops.deploy(lv.client, spec("web", replicas=2), T)
    await lv.wait(lambda: len(running(lv, "web")) == 2, 60, "web: 2 RUNNING")
    await asyncio.wait_for(ops.delete(lv.client, "web", wait=True), 60)


async def scale(lv: Live) -> None:
    await ops.deploy(lv.client, spec("chat", replicas=1), T)
    await lv.wait(lambda: len(running(lv, "chat")) == 1, 60, "chat: 1 RUNNING")
    await ops.scale(lv.client, "chat", 3)
    await lv.wait(lambda: len(running(lv, "chat")) == 3, 60, "chat: 3 RUNNING")
    await ops.scale(lv.client, "chat", 1)
    await lv.wait(lambda: list(lv.states("chat").values()) == ["running"], 60, "chat: back to 1")


async def _rolled_out(lv: Live, status: str) -> None:
    async def done() -> bool:
        v = await lv.client.get_workflow_handle("deployment/roll").query(ModelDeploymentWorkflow.rollout)
        return not v.rolling and v.status == status and not v.stopping
    for _ in range(400):
        if await done() and list(lv.states("roll").values()) == ["running"]:
            return
        await asyncio.sleep(0.3)
    raise AssertionError(f"rollout not {status!r}: {lv.states('roll')}")


async def rollout(lv: Live) -> None:
    bake = {"bake_s": 3}  # each version bakes 3 s after its last step (issue 38), recorded without a minute's wait
    v1 = spec("roll", vram_gib=20, rollout=bake)  # one 24 GiB GPU each: the second GPU is the surge's
    await ops.deploy(lv.client, v1, T)
    await lv.wait(lambda: len(running(lv, "roll")) == 1, 60, "roll v1 RUNNING")
    v2 = spec("roll", vram_gib=20, command=ECHO + " --protocol HTTP/1.1", rollout=bake)  # a changed command: the replica rolls
    await ops.deploy(lv.client, v2, T)
    await _rolled_out(lv, "version 1 rolled out")
    h = lv.client.get_workflow_handle("deployment/roll")
    await h.execute_update(ModelDeploymentWorkflow.rollout_undo)
    await _rolled_out(lv, "version 2 rolled out")


GUARANTEE = {"tenants": [{"name": "prod", "priority": 100, "guarantee": {"gpus": 1}},
                         {"name": "dev", "priority": 10}]}


async def preemption(lv: Live) -> None:
    tenants.apply(lv.engine, TenantsFile.model_validate(GUARANTEE))
    await ops.deploy(lv.client, spec("dev-m", vram_gib=20, replicas=2, tenant="dev"), T)  # both GPUs, borrowed
    await lv.wait(lambda: len(running(lv, "dev-m")) == 2, 60, "dev: 2 RUNNING")
    await ops.deploy(lv.client, spec("prod-m", vram_gib=20, tenant="prod"), T)
    await lv.wait(lambda: running(lv, "prod-m") == ["prod-m-0"] and len(running(lv, "dev-m")) == 1
                  and any(i.state == "pending" for i in lv.instances("dev-m")), 90,
                  "prod-m-0 RUNNING by preemption, one dev replica PENDING")


async def host_loss(lv: Live) -> None:
    await ops.deploy(lv.client, spec("mover", replicas=2, vram_gib=12), T)  # 12 + 12 fit one 24 GiB GPU
    await lv.wait(lambda: len(running(lv, "mover")) == 2, 60, "mover: 2 RUNNING")
    gone = next(i.name for i in lv.instances("mover") if i.worker == "h1")
    lv.stack.kill_host("h1")
    await lv.wait(lambda: next(i for i in lv.instances("mover") if i.name == gone).worker == "h2"
                  and running(lv, "mover") == sorted(lv.states("mover")), 60, f"{gone} RUNNING on h2")
    await lv.wait(lambda: {w.name: w.state for w in records.workers(lv.engine)}["h1"] == "not_ready", 30,
                  "h1 NOT_READY")


AUTOSCALING = {"min_replicas": 2, "max_replicas": 3, "interval_s": 1, "rules": ["latency_p95"]}


async def autoscale(lv: Live) -> None:
    await ops.deploy(lv.client, spec("auto", replicas=1, autoscaling=AUTOSCALING), T)
    await lv.wait(lambda: len(running(lv, "auto")) == 2, 60, "auto: scaled to min_replicas 2")
    h = lv.client.get_workflow_handle("autoscaler/auto")
    for _ in range(100):  # a few steps after the scale-up: holding at 2
        v = await h.query("autoscale")
        if len(v["history"]) >= 4:
            return
        await asyncio.sleep(0.3)
    raise AssertionError(f"the autoscaler took fewer than 4 steps: {v}")


async def config(lv: Live) -> None:
    """The cluster workflow's updates: the tenants file applied, a key made, listed and revoked, an
    admin key made, and the reads an operator makes (queue, tenants, key usage: queries of the reads
    workflow, in no history), beside one replica; the host cordoned and uncordoned."""
    from gpuflow import cluster_client

    await cluster_client.apply_tenants(lv.client, TenantsFile.model_validate(
        {"tenants": [{"name": "team-a", "limit": {"gpus": 1}}]}))
    await ops.deploy(lv.client, spec("conf", tenant="team-a"), T)
    await lv.wait(lambda: running(lv, "conf") == ["conf-0"], 60, "conf-0 RUNNING")
    key, made = await cluster_client.create_key(lv.client, "team-a", "replay")
    assert [k.id for k in await cluster_client.list_keys(lv.client)] == [made.id]
    await cluster_client.revoke_key(lv.client, key)
    await cluster_client.create_key(lv.client, "team-a", "console", scope="tenant-admin")  # a key's scope
    await cluster_client.queue(lv.client)
    await cluster_client.tenants(lv.client)
    await cluster_client.key_usage(lv.client)
    await ops.cordon(lv.client, "h1", True, "disk swap")  # the host workflow's cordon and uncordon updates
    await ops.cordon(lv.client, "h1", False)


SCENARIOS: dict[str, Scenario] = {
    "deploy": Scenario({"h1": [24, 24]}, deploy),
    "scale": Scenario({"h1": [24, 24]}, scale),
    "rollout": Scenario({"h1": [24, 24]}, rollout),
    "preemption": Scenario({"h1": [24, 24]}, preemption),
    "host_loss": Scenario({"h1": [24], "h2": [24]}, host_loss),
    "autoscale": Scenario({"h1": [24, 24]}, autoscale),
    "config": Scenario({"h1": [24]}, config),
}
