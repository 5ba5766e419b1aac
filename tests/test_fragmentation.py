"""Fragmentation as a cost (issue 25), in tables: which placements are in slivers, that a whole
placement wins over one in slivers whatever binpack says, that ``whole_only`` refuses slivers,
and that a custom engine gets a multi-GPU placement only when it declares that it splits."""

from __future__ import annotations

import pytest

from scheduler.decide import decide
from scheduler.decision import Candidate, PlannedSubordinate, claim
from scheduler.request import FlatRequest
from scheduler.scorers.fragmentation import fragmented, whole_count
from scheduler.selectors.custom import splits
from scheduler.spec import ModelSpec
from scheduler.units import GiB
from tests.conftest import cluster, gpu, inst, worker

SPLITS = "serve {port} --gpus {gpu_indexes}"


def custom(command=SPLITS, backend="custom", **kw):
    return ModelSpec.model_validate({"name": "m", "source": {"local_path": "/m"}, "backend": backend,
                                     **({"run_command": command} if backend == "custom" else {}), **kw})


@pytest.mark.parametrize("totals, need, want", [
    ([24] * 5, 20, 1),       # 24 >= 20: one GPU
    ([24, 24], 40, 2),       # 24 < 40, 24 + 24 = 48 >= 40
    ([24, 24], 43.2, 2),     # vLLM at 0.9 on two: 2 x 21.6 = 43.2 <= 48
    ([80, 24, 24], 40, 1),   # largest first: 80 >= 40
    ([24, 24, 24], 49, 3),   # 48 < 49
])
def test_whole_count(totals, need, want):
    assert whole_count([int(t * GiB) for t in totals], int(need * GiB)) == want


W = worker("h", 64, [gpu(i, 24) for i in range(8)])


@pytest.mark.parametrize("gpus, per_gpu, subs, want", [
    ([0, 1, 2, 3, 4], 4, [], True),    # 5 x 4 = 20 GiB; one 24 GiB GPU holds 20: 5 > 1, slivers
    ([0, 1], 20, [], False),           # 40 GiB needs 24 + 24: 2 = 2, whole
    ([0, 1, 2], 10, [], True),         # 30 GiB needs 2 of 24: 3 > 2
    ([0], 4, [], False),               # one GPU is always whole
    ([0], 12, [([0], 12)], True),      # across two workers: 12 + 12 = 24 GiB, one 24 GiB GPU holds it: 2 > 1
    ([0], 20, [([0], 20)], False),     # 40 GiB on a GPU of each worker needs 24 + 24: 2 = 2
])
def test_fragmented(gpus, per_gpu, subs, want):
    ws = {"h": W, "g": worker("g", 64, [gpu(0, 24)])}
    c = Candidate("h", gpus, claim(vram={i: int(per_gpu * GiB) for i in gpus}),
                  [PlannedSubordinate("g", g, claim(vram={i: int(v * GiB) for i in g})) for g, v in subs])
    assert fragmented(c, ws) is want


def test_a_whole_placement_wins_over_slivers_whatever_binpack_says():
    # worker a: 3 GPUs with 10 GiB left each (14 of 24 held); worker b: 2 empty GPUs. A 30 GiB replica:
    # a [0,1,2] at 10 GiB each (binpack 10/10 = full: 66.7) is in slivers (30 GiB needs 2 GPUs of 24);
    # b [0,1] at 15 GiB each (binpack 15/24: 41.7) is whole. Binpack alone would pick a.
    a = worker("a", 64, [gpu(i, 24) for i in range(3)])
    b = worker("b", 64, [gpu(i, 24) for i in range(2)])
    busy = [inst(f"x{i}", "other", "a", [i], {i: 14 * GiB}) for i in range(3)]
    d = decide(cluster([a, b], busy), custom(placement_strategy="binpack"), FlatRequest(vram=30 * GiB, ram=GiB))
    by = {c.worker: c for c in d.candidates}
    assert by["a"].scores["placement"] > by["b"].scores["placement"]
    assert by["b"].scores["fragmentation"] == 200.0 and by["a"].scores["fragmentation"] == 0.0
    assert d.placement.worker == "b" and d.placement.gpu_indexes == [0, 1]


def test_all_whole_or_all_in_slivers_scores_as_gpustack():
    # no mix: the scorer does not run, the scores are placement + locality alone
    d = decide(cluster([worker("b", 64, [gpu(i, 24) for i in range(2)])]), custom(), FlatRequest(vram=30 * GiB, ram=GiB))
    assert "fragmentation" not in d.placement.scores
    snap = cluster([W], [inst(f"x{i}", "other", "h", [i], {i: 20 * GiB}) for i in range(8)])
    d = decide(snap, custom(), FlatRequest(vram=20 * GiB, ram=GiB))
    assert d.placement.gpu_indexes == [0, 1, 2, 3, 4] and "fragmentation" not in d.placement.scores


def test_whole_only_refuses_slivers():
    # 8 GPUs with 4 GiB left each: 20 GiB fits only as 5 x 4 GiB
    snap = cluster([W], [inst(f"x{i}", "other", "h", [i], {i: 20 * GiB}) for i in range(8)])
    d = decide(snap, custom(), FlatRequest(vram=20 * GiB, ram=GiB), whole_only=True)
    assert not d.scheduled and any(r.startswith("fragmentation: every placement found") for r in d.reasons)


@pytest.mark.parametrize("spec, want", [
    (custom("python3 -m http.server {port}"), False),                  # says nothing: one GPU
    (custom(SPLITS), True),                                             # takes {gpu_indexes}
    (custom("srv {port}", gpu_selector={"gpus_per_replica": 2}), True),
    (custom("srv {port}", gpu_selector={"gpus_per_replica": 1}), False),
    (custom("srv --port {port} --tensor-parallel-size 2"), True),
    (custom("srv --port {port} --tensor-parallel-size=4"), True),
    (custom("srv --port {port} -tp 1"), False),                         # a size of 1 splits nothing
    (custom("srv {port}", backend_parameters=["--pipeline-parallel-size", "2"]), True),
    (custom(backend="voxbox"), False),                                  # VoxBox: one GPU a replica
])
def test_which_custom_engines_split(spec, want):
    assert splits(spec) is want


def test_an_engine_that_does_not_split_gets_no_multi_gpu_placement():
    # 8 GPUs with 4 GiB left each: a 20 GiB replica of a one-GPU engine waits, saying why
    snap = cluster([W], [inst(f"x{i}", "other", "h", [i], {i: 20 * GiB}) for i in range(8)])
    d = decide(snap, custom("python3 -m http.server {port}"), FlatRequest(vram=20 * GiB, ram=GiB))
    assert not d.scheduled
    assert any("multi_gpu: The engine is taken to run on one GPU: its run_command does not take {gpu_indexes}" in r
               for r in d.reasons), d.reasons
    # and two empty GPUs do not make a 40 GiB replica of it fit either
    d = decide(cluster([worker("b", 64, [gpu(0, 24), gpu(1, 24)])]), custom("srv {port}"), FlatRequest(vram=40 * GiB))
    assert not d.scheduled
