"""Tenancy in Kueue's terms on the real dev stack (issue 38): Temporal dev server, a control-plane
worker, four agents of simulated GPUs, stand-in engines. One stack for the file.

Hosts (the inventory names each GPU ``Simulated <size>G``, its flavor here): h1 2 x 40G (c
guarantees them), h2 2 x 48G (b, cohort lab), h3 2 x 56G (a, cohort lab), h4 2 x 24G (f may use
only these, at most 2). a's replicas are 30 GiB, one a GPU; binpack alone would put each on h1
(the fullest fit, c's).

1. a asks for 3: its own two 56G first, then it borrows its cohort mate b's unused 48G, not c's 40G.
2. b asks for 2 (its guarantee): it takes the free 48G and preempts a's borrower from the other;
   a's third comes back on c's 40G, the cohort having nothing unused left.
3. f asks for 3 of 20 GiB: 2 RUNNING on h4's 24G; the third waits with its flavor's quota,
   though h1 has a free 40G GPU it could fit.
4. p (limit 1 GPU) asks for 2 of 30 GiB: the first takes that last free GPU, so the cluster is
   full; the second shows its quota, not `unschedulable`, since quota is what blocks it."""

from __future__ import annotations

import time

from gpuflow import ops
from scheduler.tenancy.config import TenantsFile
from store import tenants
from tests.live import FAST, Live, spec
from tests.test_tenants_live import pending, running

HOSTS = {"h1": [40, 40], "h2": [48, 48], "h3": [56, 56], "h4": [24, 24]}
FILE = {"tenants": [
    {"name": "a", "cohort": "lab", "flavors": {"56G": {"guarantee": {"gpus": 2}}, "*": {}}},
    {"name": "b", "cohort": "lab", "flavors": {"48G": {"guarantee": {"gpus": 2}}, "*": {}}},
    {"name": "c", "flavors": {"40G": {"guarantee": {"gpus": 2}}, "*": {}}},
    {"name": "f", "flavors": {"24G": {"limit": {"gpus": 2}}}},
    {"name": "p", "limit": {"gpus": 1}}]}
T = FAST.model_copy(update={"pending_recheck_s": 600})  # no sweep helps within the test


def hosts_of(lv: Live, dep: str) -> list[str]:
    return sorted(i.worker for i in lv.instances(dep) if i.state == "running")


async def test_cohorts_and_flavors_on_the_dev_stack(tmp_path):
    lv = await Live(str(tmp_path), t=T).start(HOSTS)
    try:
        tenants.apply(lv.engine, TenantsFile.model_validate(FILE))
        t0 = time.monotonic()
        await ops.deploy(lv.client, spec("a-m", vram_gib=30, replicas=3, tenant="a"), T)
        await lv.wait(lambda: len(running(lv, "a-m")) == 3, 120, "a: 3 RUNNING")
        print(f"a: 3 RUNNING on {hosts_of(lv, 'a-m')} after {time.monotonic() - t0:.1f} s")
        assert hosts_of(lv, "a-m") == ["h2", "h3", "h3"]  # its own 56G, then its cohort mate's 48G

        t0 = time.monotonic()
        await ops.deploy(lv.client, spec("b-m", vram_gib=30, replicas=2, tenant="b"), T)
        await lv.wait(lambda: len(running(lv, "b-m")) == 2 and hosts_of(lv, "a-m") == ["h1", "h3", "h3"], 120,
                      "b: 2 RUNNING on h2, a's borrower moved to h1")
        print(f"b: 2 RUNNING on {hosts_of(lv, 'b-m')}, a on {hosts_of(lv, 'a-m')} after {time.monotonic() - t0:.1f} s")
        assert hosts_of(lv, "b-m") == ["h2", "h2"]

        await ops.deploy(lv.client, spec("f-m", vram_gib=20, replicas=3, tenant="f"), T)
        quota = "quota: tenant f uses 2 of its 2 24G GPUs (this replica needs 1)"
        await lv.wait(lambda: len(running(lv, "f-m")) == 2 and any(r.startswith(quota) for r in pending(lv, "f-m").values()),
                      120, "f: 2 RUNNING on h4, the third PENDING on its flavor's quota")
        assert hosts_of(lv, "f-m") == ["h4", "h4"]
        print(f"f: {hosts_of(lv, 'f-m')}; waiting: {pending(lv, 'f-m')}")

        await ops.deploy(lv.client, spec("p-m", vram_gib=30, replicas=2, tenant="p"), T)
        quota = "quota: tenant p uses 1 of its 1 GPUs (this replica needs 1)"
        await lv.wait(lambda: len(running(lv, "p-m")) == 1 and list(pending(lv, "p-m").values()) == [quota], 60,
                      "p: 1 RUNNING, the cluster full, the other PENDING on its quota")
        print(f"p: {hosts_of(lv, 'p-m')}; waiting: {pending(lv, 'p-m')}")
    finally:
        lv.close()
