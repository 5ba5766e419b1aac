"""Simulated GPUs' memory (issue 42): each replica's share of its claim (GPUFLOW_SIMULATED_VRAM_USE
over --vram-use-ratio, worker_agent/memory_probe.py) and the OOM judge (worker_agent/sim_oom.py) as
tables, then the agent's OOM kill on the real simulated process table (no stack): the replica's
log ends with the OOM line and the agent's supervision's exit reason names it."""

from __future__ import annotations

import asyncio

import pytest

from contracts.agent import LaunchRequest
from contracts.host import Booking
from scheduler.claim_apply import is_oom
from scheduler.cluster import GPU
from scheduler.units import GiB
from worker_agent.agent import simulate_oom
from worker_agent.memory_probe import ClaimShare, Proc, simulated_use
from worker_agent.sim_oom import Use, victims
from worker_agent.sim_processes import SimulatedProcessTable
from worker_agent.usage import UsageBook, simulated_share


@pytest.mark.parametrize("proc,ratio,use", [
    # the host's ratio when the replica sets no share: 10 GiB claim x 0.9 = 9 GiB
    (Proc("a", 1, {0: 10 * GiB}), 0.9, {0: 9 * GiB}),
    # its own share wins: 10 x 0.5 = 5 GiB
    (Proc("a", 1, {0: 10 * GiB}, share=0.5), 0.9, {0: 5 * GiB}),
    # what the spec states is the base, not a smaller learned claim: 14 GiB stated x 0.5 = 7 GiB on a 7.5 GiB claim
    (Proc("a", 1, {0: int(7.5 * GiB)}, share=0.5, stated=14 * GiB), 0.9, {0: 7 * GiB}),
    # over its claim: 1.5 x 8 GiB = 12 GiB
    (Proc("a", 1, {0: 8 * GiB}, share=1.5), 0.9, {0: 12 * GiB}),
    # two GPUs: the stated 20 GiB spread as the claim is (6 + 4 of 10), x 0.5 = 6 + 4 GiB
    (Proc("a", 1, {0: 6 * GiB, 1: 4 * GiB}, share=0.5, stated=20 * GiB), 0.9, {0: 6 * GiB, 1: 4 * GiB}),
])
def test_simulated_use(proc, ratio, use):
    assert simulated_use(proc, ratio) == use
    assert ClaimShare(ratio)([proc])[proc.key].gpus == use


@pytest.mark.parametrize("env,share", [
    ({}, None), ({"GPUFLOW_SIMULATED_VRAM_USE": "0.5"}, 0.5), ({"GPUFLOW_SIMULATED_VRAM_USE": "1.5"}, 1.5),
    ({"GPUFLOW_SIMULATED_VRAM_USE": "half"}, None),  # not a share (validation refused it; the agent ignores it)
    ({"GPUFLOW_SIMULATED_VRAM_USE": "-1"}, None),
])
def test_simulated_share(env, share):
    assert simulated_share(env) == share


# The judge: free per GPU (total less foreign), replicas in start order.
@pytest.mark.parametrize("free,uses,foreign,dead", [
    # 24 GiB free: 7 + 7 = 14 fits
    ({0: 24 * GiB}, [Use("a", {0: 7 * GiB}), Use("b", {0: 7 * GiB})], {}, []),
    # 24 GiB card with 10 GiB foreign: 14 free; 7 + 7 = 14 fits exactly
    ({0: 14 * GiB}, [Use("a", {0: 7 * GiB}), Use("b", {0: 7 * GiB})], {0: 10 * GiB}, []),
    # the foreign use grew to 11 GiB: 13 free; a holds 7, b's 7 passes 13 - 7 = 6: b dies (it started last)
    ({0: 13 * GiB}, [Use("a", {0: 7 * GiB}), Use("b", {0: 7 * GiB})], {0: 11 * GiB}, ["b"]),
    # a uses 1.5 x its 8 GiB = 12 GiB on a 10 GiB card: it dies alone
    ({0: 10 * GiB}, [Use("a", {0: 12 * GiB})], {}, ["a"]),
    # a dead replica's use is not counted: a (12) dies, b (6) fits in 10
    ({0: 10 * GiB}, [Use("a", {0: 12 * GiB}), Use("b", {0: 6 * GiB})], {}, ["a"]),
    # across two GPUs: GPU 1 is full, so c dies though GPU 0 had room
    ({0: 24 * GiB, 1: 4 * GiB}, [Use("c", {0: 2 * GiB, 1: 5 * GiB})], {}, ["c"]),
    # a GPU not in the inventory is not judged
    ({0: 4 * GiB}, [Use("d", {3: 50 * GiB})], {}, []),
])
def test_victims(free, uses, foreign, dead):
    assert sorted(victims(free, uses, foreign)) == dead


def test_the_message_names_oom_the_room_and_the_foreign_use():
    (why,) = victims({0: 13 * GiB}, [Use("a", {0: 7 * GiB}), Use("b", {0: 7 * GiB})], {0: 11 * GiB}).values()
    assert why == ("torch.OutOfMemoryError: CUDA out of memory (simulated): tried to hold 7.0 GiB on GPU 0 "
                   "with 6.0 GiB free (11.0 GiB used by other processes)")
    assert is_oom(why)


async def test_the_agent_kills_a_replica_over_its_gpu_as_an_oom(tmp_path):
    # two replicas on a 24 GiB simulated card with 10 GiB foreign (14 free): a uses 0.5 x 14 = 7 GiB,
    # b uses 1.5 x 6 = 9 GiB; 7 + 9 = 16 > 14: b, started second, dies with the OOM line; a runs on
    t = SimulatedProcessTable(str(tmp_path), start_delay=0.01)
    book = UsageBook(ClaimShare(0.9))
    recs = []
    for name, claim, env in (("a-0", 14, {"GPUFLOW_SIMULATED_VRAM_USE": "0.5"}),
                             ("b-0", 6, {"GPUFLOW_SIMULATED_VRAM_USE": "1.5"})):
        req = LaunchRequest(instance=name, model=name[0], backend="custom", gpu_indexes=[0], env=env)
        book.watch(req, Booking(booked=True, gpu_indexes=[0], vram_claim={0: claim * GiB}))
        recs.append(t.start(name, ["x"], {}, None))
        await asyncio.sleep(0.01)  # b starts after a
    book.sample(t.records())
    gpu = GPU(index=0, vendor="nvidia", type="cuda", vram_total=24 * GiB, vram_foreign=10 * GiB)
    assert simulate_oom(book, t, [gpu]) == ["b-0"]
    assert t.returncode(recs[1].pid) == -9 and t.returncode(recs[0].pid) is None
    assert is_oom(t.tail("b-0")) and "tried to hold 9.0 GiB on GPU 0 with 7.0 GiB free" in t.tail("b-0")
    assert simulate_oom(book, t, [gpu]) == []  # already dead: not killed twice


def test_an_oom_is_reported_once_with_the_replicas_last_figures():
    # a replica at 9 GiB of a 6 GiB claim ends out of memory: the next report carries it once, marked oom
    book = UsageBook(ClaimShare(1.5))
    req = LaunchRequest(instance="b-0", model="b", backend="custom", gpu_indexes=[0])
    book.watch(req, Booking(booked=True, gpu_indexes=[0], vram_claim={0: 6 * GiB}))
    from worker_agent.processes import Record

    book.sample([Record("b-0", 10_000_001, None, [], "")])
    book.report()
    assert not book.due()
    book.mark_oom("b-0")
    book.sample([])  # its process is gone
    assert book.due()
    (r,) = book.report()
    assert (r.instance, r.oom, r.vram_used, r.vram_claimed) == ("b-0", True, 9 * GiB, 6 * GiB)
    assert book.report() == [] and not book.due()  # once
