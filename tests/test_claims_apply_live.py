"""Learned claims applied, live (issue 42), on one stack: the Temporal dev server, a control-plane
worker, an agent over an inventory file whose engines are real processes (``box``: as ``gpuflow dev``
runs it), and, for the last test, ``gpuflow simulate``'s host.

The recommender is told to trust little (GPUFLOW_CLAIMS__MIN_SAMPLES 3, __MIN_HISTORY_S 4), the
agents sample every second and report every 2.4 s (liveness 1 s, host watch 3 s).

- box has one 24 GiB GPU. A deployment of 14 GiB whose replicas use half of it
  (GPUFLOW_SIMULATED_VRAM_USE 0.5: 7 GiB) is scaled to 2 once its claim is confident: under advise
  the second waits (14 + 14 > 24), under apply it is placed beside the first (14 + p90 7 GiB x
  1.15 = 8.05 GiB: 22 <= 24), the decision keeps the recommender's state and replays the same.
- On ``gpuflow simulate``'s host (GPU 0: 24 GiB of which 14 are held by other processes; GPUs 1
  and 2: 24 GiB free), a replica of 8 GiB that uses 1.5x its claim (12 GiB) is binpacked onto GPU 0 (the
  fuller that holds 8 GiB), passes the 10 GiB free there, dies of a (simulated) OOM, gets its claim
  bumped to max(1.2 x 12, 12 + 0.1) = 14.4 GiB and is placed again where a GPU holds it: GPU 1.
  Then the half-use deployment again, pinned to GPU 2: two to the GPU once its claim is confident."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from gpuflow import ops
from scheduler.claims.recommender import recommend
from scheduler.claims.settings import ClaimSettings
from store import claims
from store import decision_log
from store.decision_replay import load
from tests.live import FAST, Live, cli, spec, timings_env

T = FAST.model_copy(update={"liveness_s": 1.0, "host_watch_s": 3.0})
CLAIMS = {"GPUFLOW_CLAIMS__MIN_SAMPLES": "3", "GPUFLOW_CLAIMS__MIN_HISTORY_S": "4"}
GiB = 2**30


@pytest.fixture(scope="module")
async def lv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("claims")
    live = await Live(str(tmp), t=T, env=CLAIMS).start({"box": [24]})
    yield live
    live.close()


def running(lv: Live, name: str) -> list:
    return [i for i in lv.instances(name) if i.state == "running"]


async def confident(lv: Live, name: str) -> None:
    """Until the store's learned claim for the deployment is confident (as the control plane judges it)."""
    settings = ClaimSettings(min_samples=3, min_history_s=4)

    def ok() -> bool:
        return any(name in (r.deployments or []) and recommend(r.claim_state(), settings, time.time()).confident
                   for r in claims.all_claims(lv.engine))

    await lv.wait(ok, 90, f"{name}'s learned claim confident", every=1.0)


@pytest.mark.parametrize("mode,second", [("advise", "pending"), ("apply", "running")])
async def test_half_use_two_to_a_gpu_only_under_apply(lv, mode, second):
    name = f"half-{mode}"
    s = spec(name, vram_gib=14, env={"GPUFLOW_SIMULATED_VRAM_USE": "0.5"}, claims=mode)
    await ops.deploy(lv.client, s, T)
    await lv.wait(lambda: len(running(lv, name)) == 1, 60, f"{name}-0 RUNNING")
    first = running(lv, name)[0].name
    await confident(lv, name)
    await ops.scale(lv.client, name, 2)
    await lv.wait(lambda: sorted((i.state, bool(i.reason) or i.state == "running") for i in lv.instances(name))
                  == sorted([("running", True), (second, True)]), 60, f"{name}: the second replica {second.upper()}")
    if mode == "apply":
        second_row = next(i for i in lv.instances(name) if i.name != first)
        row = decision_log.latest(lv.engine, second_row.name)
        inputs = load(lv.engine, row.digest)
        learned = inputs.request.learned
        assert learned is not None and learned.estimate == 14 * GiB and learned.samples >= 3
        assert 7 * GiB < learned.claim < 9 * GiB  # p90 of 7 GiB + 15% (the histogram's bucket): about 8 GiB
        out = cli(lv, "explain", second_row.name, "--replay")
        assert out.returncode == 0 and "same decision" in out.stdout, out.stdout + out.stderr
        shown = cli(lv, "explain", second_row.name).stdout
        assert "learned from" in shown and "the estimate was 14.0 GiB" in shown, shown
    else:  # advise: the estimate booked, the second waits for room
        waiting = next(i for i in lv.instances(name) if i.state == "pending")
        assert "GiB" in waiting.reason, waiting.reason
        assert all(i.placement is None or sum(i.placement["claim"]["vram"].values()) == 14 * GiB
                   for i in lv.instances(name))
    await ops.delete(lv.client, name, wait=True)


async def test_a_replica_waiting_for_room_is_placed_once_its_claim_is_confident(lv):
    # two replicas at once: the second waits (14 + 14 > 24 GiB) while the claim learns; the report that makes it
    # confident wakes the PENDING queue, so the second is placed at the learned ~8 GiB within seconds, not at the
    # queue's next sweep (pending_recheck_s: 120 s here, 600 s by default)
    name = "half-early"
    await ops.deploy(lv.client, spec(name, vram_gib=14, replicas=2, env={"GPUFLOW_SIMULATED_VRAM_USE": "0.5"},
                                     claims="apply"), T)
    await lv.wait(lambda: sorted(i.state for i in lv.instances(name)) == ["pending", "running"], 60,
                  f"{name}: one replica RUNNING, one PENDING")
    await confident(lv, name)
    await lv.wait(lambda: len(running(lv, name)) == 2, 30, f"{name}'s second replica RUNNING once the claim is confident")
    booked = sorted(sum(r.placement["claim"]["vram"].values()) for r in running(lv, name))
    assert booked[1] == 14 * GiB and 7 * GiB < booked[0] < 9 * GiB, booked
    await ops.delete(lv.client, name, wait=True)


async def test_over_use_is_bumped_and_placed_again_on_simulate(lv, tmp_path):
    inv = str(tmp_path / "sim.yaml")
    with open(inv, "w") as f:
        yaml.safe_dump({"ram_total": "64 GiB", "gpus": [
            {"index": 0, "vram_total": "24 GiB", "name": "Simulated 24G", "vram_used_by_others": "14 GiB"},
            {"index": 1, "vram_total": "24 GiB", "name": "Simulated 24G"},
            {"index": 2, "vram_total": "24 GiB", "name": "Simulated 24G"}]}, f)
    sim = subprocess.Popen([sys.executable, "-m", "gpuflow", "simulate", "--hosts", "1", "--inventory", inv,
                            "--address", lv.stack.temporal.address, "--data-dir", str(tmp_path / "sim"),
                            "--start-delay", "0.2"], env={**os.environ, **timings_env(T), **lv.join_env()},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        s = spec("over", vram_gib=8, command="my-server --port {port}", placement_strategy="binpack",
                 env={"GPUFLOW_SIMULATED_VRAM_USE": "1.5"}, claims="apply")  # my-server: only simulate runs it
        await ops.deploy(lv.client, s, T)
        await lv.wait(lambda: any(i.state == "running" and i.worker == "sim-0" and i.gpu_indexes == [1]
                                  for i in lv.instances("over")), 120,
                      "over-0 OOM'd on GPU 0, bumped and RUNNING on GPU 1")
        (i,) = [i for i in lv.instances("over") if i.state == "running"]
        assert sum(i.placement["claim"]["vram"].values()) >= int(14.4 * GiB) - 2**20  # the bump: 1.2 x 12 GiB
        row = decision_log.latest(lv.engine, i.name)
        assert load(lv.engine, row.digest).request.learned.bumped

        # half use on simulate's GPU 2 (pinned): 14 GiB, then once confident a second at the learned ~8 GiB beside it
        half = spec("half-sim", vram_gib=14, command="my-server --port {port}", claims="apply",
                    env={"GPUFLOW_SIMULATED_VRAM_USE": "0.5"}, gpu_selector={"gpu_ids": ["sim-0:cuda:2"]})
        await ops.deploy(lv.client, half, T)
        await lv.wait(lambda: len(running(lv, "half-sim")) == 1, 60, "half-sim's first replica RUNNING")
        await confident(lv, "half-sim")
        await ops.scale(lv.client, "half-sim", 2)
        await lv.wait(lambda: len(running(lv, "half-sim")) == 2, 60, "half-sim's second replica RUNNING on GPU 2")
        booked = sorted(sum(r.placement["claim"]["vram"].values()) for r in running(lv, "half-sim"))
        assert booked[1] == 14 * GiB and 7 * GiB < booked[0] < 9 * GiB  # 14 + ~8 <= 24: two to the GPU
        assert {(r.worker, tuple(r.gpu_indexes)) for r in running(lv, "half-sim")} == {("sim-0", (2,))}
    finally:
        sim.send_signal(signal.SIGINT)
        try:
            sim.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            sim.kill()
            sim.wait()
