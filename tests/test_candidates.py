"""scheduler/candidates.py: one-GPU candidates kept as columns score, pick and rank exactly as the
same candidates built as objects do (the scorers' per-candidate path), on randomized clusters
with files on some workers and topology on some; and a built candidate is stable."""

from __future__ import annotations

import pytest

from scheduler import occupancy, selectors
from scheduler.candidates import GpuRows
from scheduler.cluster import ClusterSnapshot
from scheduler.decide import scale_up_chain
from scheduler.decision import Candidate, Context, claim
from scheduler.policy_config import PolicyConfig
from scheduler.request import FlatRequest
from scheduler.scorers import apply_chain, pick
from scheduler.spec import ModelSpec
from scheduler.units import GiB
from tests.random_cluster import changed, snapshot_dict


def test_a_row_builds_the_candidate_the_list_held():
    rows = GpuRows()
    rows.add("w1", 3, 30 * GiB, 8 * GiB, "cuda", 0.9)
    rows.add("w2", 0, 30 * GiB, 8 * GiB, "cuda")
    rows.add("w3", 1, 30 * GiB, 8 * GiB, "rocm")
    want = Candidate("w1", [3], claim(ram=8 * GiB, vram={3: 30 * GiB}, vram_utilization=0.9), gpu_type="cuda")
    assert rows[0].to_dict() == want.to_dict() and rows[0] is rows[0] and rows[-3] is rows[0]
    # placement 100 and locality 5 weights: contributions 60 + 0, 75 + 5, 75 + 0 -> totals 60, 80, 75
    rows.set_scores(["placement", "locality"], [[60.0, 75.0, 75.0], [0.0, 5.0, 0.0]], [60.0, 80.0, 75.0])
    assert rows[0].score == 60.0 and rows[1].scores == {"placement": 75.0, "locality": 5.0}
    assert pick(rows) is rows[1] and [c.worker for c in rows.top(2)] == ["w2", "w3"]
    rows.set_scores(["placement"], [[70.0, 70.0, 60.0]], [70.0, 70.0, 60.0])  # a tie: the first row wins
    assert pick(rows) is rows[0] and [c.worker for c in rows.top(3)] == ["w1", "w2", "w3"]
    with pytest.raises(IndexError):
        rows[3]


SPECS = [ModelSpec(name="m", source={"huggingface": {"repo": "o/m"}}, backend="custom", run_command="x"),
         ModelSpec(name="m", source={"huggingface": {"repo": "o/m"}}, backend="custom", run_command="x",
                   placement_strategy="binpack"),
         ModelSpec(name="other", source={"huggingface": {"repo": "o/m"}}, backend="vllm"),
         ModelSpec(name="m", source={"huggingface": {"repo": "o/m"}}, backend="sglang", placement_strategy="binpack")]


@pytest.mark.parametrize("seed", range(80))
def test_columns_score_as_objects(seed):
    d = snapshot_dict(seed) if seed % 2 else changed(seed, snapshot_dict(seed))
    snap = ClusterSnapshot.model_validate(d)
    occ = occupancy.of(snap)
    for spec in SPECS:
        for vram in (4, 20, 60):
            ctx = Context(spec, snap, FlatRequest(vram=vram * GiB, ram=GiB), PolicyConfig(), occ.allocatable, None, occ)
            _, rows = selectors.select(ctx, list(snap.workers), [])
            if not isinstance(rows, GpuRows):
                continue
            _, again = selectors.select(ctx, list(snap.workers), [])
            objects = list(again)  # built before scoring: scored one by one, as any list of candidates
            apply_chain(rows, scale_up_chain(ctx))
            apply_chain(objects, scale_up_chain(ctx))
            assert [c.to_dict() for c in rows] == [c.to_dict() for c in objects]
            assert pick(rows).to_dict() == pick(objects).to_dict()
            top = sorted(objects, key=lambda c: -round(c.score, 4))[:10]
            assert [c.to_dict() for c in rows.top(10)] == [c.to_dict() for c in top]
