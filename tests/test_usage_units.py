"""Measured memory per replica, the agent's side: the process tree, NVML's per-process list over
it (the in-memory NVML of test_inventory_nvml.py, over real processes), the simulated share of
the claim, the book's latest and peak, and when a figure is news for the watch to carry."""

from __future__ import annotations

import os

import pytest

from contracts.agent import LaunchRequest
from contracts.host import Booking
from contracts.usage import GpuUse, ReplicaUse
from scheduler.units import GiB, MiB
from tests.test_inventory_nvml import FakeNVML, engine_with_child
from worker_agent.memory_probe import ClaimShare, NvmlProbe, Proc, ProcInfo, read_procs, trees
from worker_agent.processes import ProcessTable, Record
from worker_agent.usage import UsageBook, moved, worth_reporting


def test_a_tree_is_the_leader_its_session_and_their_descendants():
    procs = {
        100: ProcInfo(ppid=1, session=100, rss=1),    # the leader (its own session)
        101: ProcInfo(ppid=100, session=100, rss=1),  # its worker
        102: ProcInfo(ppid=101, session=102, rss=1),  # the worker's child, which left the session: a descendant
        103: ProcInfo(ppid=1, session=100, rss=1),    # re-parented to init, still in the session
        200: ProcInfo(ppid=1, session=200, rss=1),    # another replica
        300: ProcInfo(ppid=1, session=300, rss=1),    # a stranger
    }
    assert trees({"a-0": 100, "b-0": 200, "gone-0": 999}, procs) == {"a-0": {100, 101, 102, 103}, "b-0": {200}}


@pytest.mark.parametrize("a, b, news", [
    (8 * GiB, 8 * GiB + 64 * MiB, False),   # 64 MiB: not more than max(64 MiB, 8 GiB / 16 = 512 MiB)
    (8 * GiB, 8 * GiB + 600 * MiB, True),   # 600 MiB > 8.59 GiB / 16 = 550 MiB
    (0, 60 * MiB, False),                   # a small model's first MiBs: under 64 MiB
    (0, 100 * MiB, True),                   # 100 MiB > 64 MiB
    (1 * GiB, 0, True),                     # gone to nothing
])
def test_a_move_is_news_past_a_sixteenth_and_64_MiB(a, b, news):
    assert moved(a, b) is news


def use(name: str, used: int, claimed: int = 10 * GiB, rss: int = GiB) -> ReplicaUse:
    return ReplicaUse(instance=name, gpus=[GpuUse(index=0, used=used, peak=used, claimed=claimed)], rss=rss,
                      measured="nvml")


@pytest.mark.parametrize("last, now, news", [
    (None, {}, False),                                                   # nothing runs, nothing said yet
    (None, {"a": use("a", 9 * GiB)}, True),                              # the first figures
    ({"a": use("a", 9 * GiB)}, {"a": use("a", 9 * GiB + 100 * MiB)}, False),  # 100 MiB < 9.1 GiB / 16
    ({"a": use("a", 9 * GiB)}, {"a": use("a", 4 * GiB)}, True),          # loading or shrinking: 5 GiB moved
    ({"a": use("a", 9 * GiB)}, {"a": use("a", 9 * GiB), "b": use("b", 1)}, True),  # a replica came
    ({"a": use("a", 9 * GiB), "b": use("b", 1)}, {"a": use("a", 9 * GiB)}, True),  # one went
    ({"a": use("a", 10 * GiB - 100 * MiB)}, {"a": use("a", 10 * GiB + 100 * MiB)}, True),  # 200 MiB, but over its 10 GiB claim
    ({"a": use("a", 9 * GiB, rss=GiB)}, {"a": use("a", 9 * GiB, rss=3 * GiB)}, True),  # RSS moved 2 GiB
])
def test_the_watch_returns_early_only_for_news(last, now, news):
    assert worth_reporting(last, now) is news


def test_simulated_use_is_the_claim_times_the_ratio():
    """10 GiB claimed on GPU 0 and 6 GiB on GPU 1 at 0.9: 9 and 5.4 GiB; RSS 2 GiB x 0.9 (a simulator's
    pid is no real process)."""
    held = ClaimShare(0.9)([Proc("s-0", 10_000_001, {0: 10 * GiB, 1: 6 * GiB}, 2 * GiB)])["s-0"]
    assert held.gpus == {0: int(10 * GiB * 0.9), 1: int(6 * GiB * 0.9)} and held.measured == "simulated"
    assert held.rss == int(2 * GiB * 0.9)
    with pytest.raises(ValueError, match="between 0 and 4"):
        ClaimShare(5)


async def test_nvml_per_process_counts_the_replicas_children_and_not_strangers(tmp_path):
    """Card 0 lists the leader (6 GiB), its child (3 GiB) and this test's own pid (5 GiB, a stranger);
    card 1 lists the child (1 GiB). The replica holds 6 + 3 = 9 GiB on card 0 and 1 GiB on card 1;
    its RSS is the tree's (both processes: more than either alone)."""
    table = ProcessTable(str(tmp_path))
    async with engine_with_child(table, "m-0") as (rec, child):
        nvml = FakeNVML([{"name": "H100", "total": 80 * GiB, "used": 14 * GiB,
                          "procs": [(rec.pid, 6 * GiB), (child, 3 * GiB), (os.getpid(), 5 * GiB)]},
                         {"name": "H100", "total": 80 * GiB, "used": GiB, "procs": [(child, GiB)]}])
        held = NvmlProbe(nvml)([Proc("m-0", rec.pid, {0: 10 * GiB})])["m-0"]
        assert held.gpus == {0: 9 * GiB, 1: GiB} and held.measured == "nvml"
        tree = read_procs()
        assert held.rss >= tree[rec.pid].rss + tree[child].rss > 0
        assert nvml.open == 0  # NVML shut down after each sample

        # no per-process list on any card (some containers): RSS only, VRAM unknown
        blind = NvmlProbe(FakeNVML([{"name": "H100", "total": 80 * GiB, "used": 0}]))([Proc("m-0", rec.pid)])["m-0"]
        assert blind.gpus is None and blind.measured == "none" and blind.rss > 0


def test_the_book_keeps_the_latest_and_the_peak_per_replica():
    """Samples of 4, 9 and 7 GiB on a 10 GiB claim: latest 7, peak 9. A helper (instance@rpc0) on
    the same host adds its use to its instance's but no claim; a replica that stopped leaves."""
    figures = iter([{"w-0": 4 * GiB, "w-0@rpc0": GiB}, {"w-0": 9 * GiB, "w-0@rpc0": GiB}, {"w-0": 7 * GiB, "w-0@rpc0": GiB}])

    class Seq:  # the probe seam, answering a scripted figure per sample
        def __call__(self, procs):
            from worker_agent.memory_probe import Held

            now = next(figures)
            return {p.key: Held({0: now[p.key]}, 2 * GiB, "nvml") for p in procs}

    book = UsageBook(Seq(), clock=lambda: 1000.0)
    book.gpu_names = {0: "NVIDIA H100 80GB HBM3"}
    req = LaunchRequest(instance="w-0", model="w", backend="llama.cpp", gpu_indexes=[0], vram_claim={0: 10 * GiB},
                        ram_claim=GiB, source="huggingface:Qwen/Qwen2-0.5B-GGUF:q4.gguf", backend_parameters=["-c", "4096"])
    booked = Booking(booked=True, gpu_indexes=[0], vram_claim={0: 10 * GiB}, ram_claim=GiB)  # the ledger's, here
    book.watch(req, booked)
    book.watch(req.model_copy(update={"role": "rpc-server", "part": "rpc0"}), booked)
    recs = [Record("w-0", 11, 8000, [], ""), Record("w-0@rpc0", 12, 8001, [], "")]
    assert book.report() is None and not book.due()  # nothing sampled yet: nothing to say
    for _ in range(3):
        book.sample(recs)
    (r,) = book.report()
    assert (r.vram_used, r.vram_peak, r.vram_claimed) == (8 * GiB, 10 * GiB, 10 * GiB)  # 7 + 1, 9 + 1, the server's claim
    assert (r.rss, r.ram_claimed, r.gpu_model, r.backend, r.parameters) == (
        4 * GiB, GiB, "NVIDIA H100 80GB HBM3", "llama.cpp", "-c 4096")  # 2 GiB RSS each
    assert not book.due()  # just carried
    book.probe = lambda procs: {}
    book.sample([])
    assert book.due() and book.report() == []  # the replica is gone: news, and nothing to report


@pytest.mark.parametrize("last, now, first_due, at_30s", [
    # settle 30 s (three samples of 10 s): (due at the sample that shows it, due 30 s later)
    ({"a": use("a", 9 * GiB)}, {"a": use("a", 9 * GiB), "b": use("b", 9 * GiB)}, False, True),  # a replica came
    ({"a": use("a", 9 * GiB), "b": use("b", 1)}, {"a": use("a", 9 * GiB)}, False, True),  # one went
    ({"a": use("a", 4 * GiB)}, {"a": use("a", 9 * GiB)}, False, True),        # loading: 5 GiB moved
    ({"a": use("a", 9 * GiB)}, {"a": use("a", 9 * GiB + 100 * MiB)}, False, False),  # no news: never
    ({"a": use("a", 9 * GiB)}, {"a": use("a", 10 * GiB + 100 * MiB)}, True, True),  # over its 10 GiB claim: at once
    ({"a": use("a", 11 * GiB)}, {"a": use("a", 9 * GiB)}, True, True),        # back under it: at once
    ({}, {"b": use("b", 11 * GiB)}, True, True),                              # came over its claim: at once
])
def test_news_that_is_not_urgent_waits_the_settle(last, now, first_due, at_30s):
    """Issue 37: each report is a workflow task and two local activities on the host's history; the
    replicas a burst lands on one host now ride one report. What a learned claim must hear (over
    its claim, back under, an OOM) still returns the watch at once."""
    t = [1000.0]
    book = UsageBook(Flat(), clock=lambda: t[0], settle_s=30.0)
    book.reported, book.latest, book.sampled = last, now, True
    assert book.due() is first_due
    t[0] += 29.9
    assert book.due() is first_due  # not yet 30 s since the news was first seen
    t[0] += 0.1
    assert book.due() is at_30s
    book.report()
    assert not book.due()  # carried: the settle starts again at the next news


class Flat:
    """The probe seam: every process holds 5 GiB on GPU 0 and 1 GiB of RSS."""

    def __call__(self, procs):
        from worker_agent.memory_probe import Held

        return {p.key: Held({0: 5 * GiB}, GiB, "nvml") for p in procs}


def test_a_relaunch_never_wipes_the_claim_and_only_booked_parts_are_reported():
    """The claim is the ledger's (the booking's), not the request's: the probe's relaunch of the
    booked server carried vram_claim {} and had wiped the replica's reported claim (10 -> 0 GiB).
    A process the table runs but no booking check let through (an earlier run's p9, a pid file
    written by hand) is neither measured nor reported."""
    book = UsageBook(Flat(), clock=lambda: 1000.0)
    booked = Booking(booked=True, gpu_indexes=[0], vram_claim={0: 10 * GiB}, ram_claim=GiB)
    first = LaunchRequest(instance="w-0", model="w", backend="vllm", gpu_indexes=[0], vram_claim={0: 10 * GiB},
                          ram_claim=GiB)
    book.watch(first, booked)
    book.watch(first.model_copy(update={"vram_claim": {}, "ram_claim": 0}), booked)  # the relaunch: adopted
    book.watch(first.model_copy(update={"vram_claim": {0: 80 * GiB}}), booked)  # nor can one inflate it
    recs = [Record("w-0", 11, 8000, [], ""), Record("w-0@p9", 12, 8001, [], ""), Record("ghost-0", 13, 8002, [], "")]
    (r,) = book.sample(recs).values()
    # w-0 alone: 5 GiB used of the ledger's 10 (p9's 5 GiB and ghost-0's are not counted: not booked)
    assert (r.instance, r.vram_used, r.vram_claimed, r.ram_claimed) == ("w-0", 5 * GiB, 10 * GiB, GiB)
    assert [x.instance for x in book.report()] == ["w-0"]


def test_a_process_launched_while_a_sample_runs_is_measured_from_the_next_sample():
    """The agent lists its table, then samples in a thread; a launch in between (on the event loop)
    adds a process the listing lacks. It had been forgotten as gone, and its replica was never
    measured again (a live test's NVML host showed no VRAM figure for a minute under load)."""
    book = UsageBook(Flat(), clock=lambda: 1000.0)
    booked = Booking(booked=True, gpu_indexes=[0], vram_claim={0: 10 * GiB}, ram_claim=GiB)
    a = LaunchRequest(instance="a-0", model="a", backend="vllm", gpu_indexes=[0], vram_claim={0: 10 * GiB})
    b = a.model_copy(update={"instance": "b-0", "model": "b"})
    book.watch(a, booked)                       # seq 1
    listed = book.seq                           # the table is listed: a-0 alone
    book.watch(b, booked)                       # seq 2: b-0 launched while the sample runs
    assert set(book.sample([Record("a-0", 11, 8000, [], "")], listed)) == {"a-0"}
    assert book.watching("b-0")                 # watched after the listing: not forgotten
    assert set(book.sample([Record("a-0", 11, 8000, [], ""), Record("b-0", 12, 8001, [], "")])) == {"a-0", "b-0"}
    book.sample([Record("b-0", 12, 8001, [], "")], book.seq)  # a-0's process gone, watched before: forgotten
    assert not book.watching("a-0") and book.watching("b-0")


def test_what_crosses_temporal_is_bounded():
    from contracts.usage import UsageBatch
    from tests.test_bounds import model_problems

    assert model_problems(UsageBatch, set()) == []


def test_the_dashboard_plots_each_replicas_use_against_its_claim():
    """The series it plots are exported (tests/test_dashboard.py checks every one against the registries)."""
    import json

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "deploy", "grafana", "gpuflow.json")) as f:
        exprs = " ".join(t["expr"] for p in json.load(f)["panels"] for t in p["targets"])
    assert "gpuflow_instance_vram_used_bytes" in exprs and "gpuflow_instance_vram_claimed_bytes" in exprs
    with open(os.path.join(root, "deploy", "prometheus", "prometheus.yml")) as f:
        assert "honor_labels: true" in f.read()  # the replica's own "instance" label is kept
