"""A guarantee kept in whole replicas, on the real dev stack (issue 25): one host of 8 simulated
GPUs of 24 GiB, replicas of 20 GiB. poc (limit 2) and dev (limit 6) fill it, leaving 4 GiB on
every GPU. prod (priority 100, guarantee 4 GPUs) then asks for 4 replicas. Before: its first
replica went across GPUs 0-4 in the 4 GiB left on each, counted as 5 GPUs, so prod borrowed and
could preempt no more (1 RUNNING, 3 PENDING for minutes). Now: prod holds 4 replicas of one whole
GPU each, poc 0, dev 4, within 60 s of prod's deploy, every victim drained before its GPU is
reused. Twice: with an engine that runs on one GPU (the plain echo command: no multi-GPU placement
is offered at all) and with one that declares it splits a replica over GPUs (its command takes
{gpu_indexes}: the slivers are offered, and prod takes whole GPUs by preemption instead)."""

from __future__ import annotations

import time

import pytest

from store import tenants
from gpuflow import ops
from scheduler.tenancy.config import TenantsFile
from tests.live import ECHO, FAST, Live, spec
from tests.test_tenants_live import SCENARIO, pending, preemptions, running, within_limits

ONE_HOST = {"h1": [24] * 8}  # 8 simulated GPUs on one host: a 20 GiB replica fits in 5 slivers of 4 GiB
T = FAST.model_copy(update={"pending_recheck_s": 600})  # the default: no sweep helps within the test
SPLITS = "python3 -m http.server {port} --bind {host} --directory /tmp/gpus-{gpu_indexes}"  # declares it splits


@pytest.mark.parametrize("command", [ECHO, SPLITS], ids=["one-gpu-engine", "splitting-engine"])
async def test_a_guarantee_is_reclaimed_in_whole_gpus_at_once(tmp_path, command):
    lv = await Live(str(tmp_path), t=T).start(ONE_HOST, servers=2)
    check = lambda: within_limits(lv, SCENARIO)  # noqa: E731
    try:
        tenants.apply(lv.engine, TenantsFile.model_validate(SCENARIO))
        await ops.deploy(lv.client, spec("poc-m", vram_gib=20, replicas=2, tenant="poc", command=command), T)
        await lv.wait(lambda: len(running(lv, "poc-m")) == 2, 90, "poc: 2 RUNNING", check=check)
        await ops.deploy(lv.client, spec("dev-m", vram_gib=20, replicas=6, tenant="dev", command=command), T)
        await lv.wait(lambda: len(running(lv, "dev-m")) == 6, 120, "dev: 6 RUNNING", check=check)
        t0 = time.monotonic()
        await ops.deploy(lv.client, spec("prod-m", vram_gib=20, replicas=4, tenant="prod", command=command), T)
        await lv.wait(lambda: len(running(lv, "prod-m")) == 4 and len(running(lv, "dev-m")) == 4
                      and not running(lv, "poc-m"), 60, "prod 4, dev 4, poc 0 RUNNING", check=check)
        print(f"prod: 4 whole-GPU replicas RUNNING {time.monotonic() - t0:.1f} s after the deploy")
        placed = {i.name: i for i in lv.instances("prod-m") if i.state == "running"}
        for i in placed.values():  # one whole GPU each, as on an empty cluster of 4 GPUs
            assert len(i.gpu_indexes) == 1, (i.name, i.gpu_indexes)
        assert len({g for i in placed.values() for g in i.gpu_indexes}) == 4
        assert tenants.usage(lv.engine)["prod"].gpus == 4
        assert preemptions(lv) == {("prod", "poc"): 2, ("prod", "dev"): 2}
        for name, reason in {**pending(lv, "poc-m"), **pending(lv, "dev-m")}.items():
            if reason.startswith("preempted"):
                assert "to reclaim prod's guarantee" in reason, (name, reason)
    finally:
        lv.close()
