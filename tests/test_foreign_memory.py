"""Memory gpuflow does not own (scheduler/foreign.py): booked around with a margin in the fit,
named when it refuses, judged when it grows (the degradation), declared by simulated GPUs
(``vram_used_by_others``), and replayed with the margin the decision ran with."""

from __future__ import annotations

import json

import pytest

from scheduler import occupancy
from scheduler.allocatable import Allocated, allocatable, allocatable_map
from scheduler.cluster import GPU, ClusterSnapshot, Instance, Worker
from scheduler.decide import decide
from scheduler.estimate import FlatRequest
from scheduler.foreign import degradations, refusal, with_margin, words
from scheduler.policy_config import PolicyConfig
from scheduler.reasons import pending_text
from scheduler.spec import ModelSpec
from scheduler.units import GiB, MiB

CUSTOM = {"name": "eng", "source": {"local_path": "/models/x"}, "backend": "custom",
          "run_command": "x --port {port}"}


@pytest.mark.parametrize("foreign,margin,booked", [
    (None, 0.1, 0),                       # unknown: nothing booked
    (0, 0.1, 0),
    (10 * GiB, 0.0, 10 * GiB),            # no margin: the figure alone
    (10 * GiB, 0.1, 11 * GiB),            # 10 + ceil(10 x 0.1) = 11 GiB
    (3 * GiB, 0.5, 4.5 * GiB),            # 3 + 1.5
    (1, 0.1, 2),                          # 1 byte + ceil(0.1) = 2: the margin rounds up
    (256 * MiB, 1.0, 512 * MiB),          # the most the setting allows: twice the figure
])
def test_the_margin_on_foreign_use(foreign, margin, booked):
    assert with_margin(foreign, margin) == booked


@pytest.mark.parametrize("total,reserve,claimed,used,foreign,margin,left", [
    (24, 0, 0, None, 10, 0.1, 13),     # 24 - (0 + 10 x 1.1) = 13
    (24, 0, 0, None, 10, 0.0, 14),     # 24 - 10 = 14
    (24, 1, 8, None, 10, 0.1, 4),      # 24 - 1 - (8 + 11) = 4
    (24, 0, 8, 22, 10, 0.1, 2),        # used 22 > 8 + 11 = 19: 24 - 22 = 2 (used still counts)
    (24, 0, 8, 12, 2, 0.5, 12),        # 8 + 2 + ceil(2 x 0.5) = 11 < used 12: 24 - 12 = 12
    (80, 0, 0, None, 0, 0.1, 80),      # no foreign use: nothing off
    (24, 0, 20, None, 10, 0.1, 0),     # 24 - 31 < 0: nothing, never negative
])
def test_foreign_memory_in_the_fit(total, reserve, claimed, used, foreign, margin, left):
    w = Worker(name="g1", ram_total=64 * GiB, reserved={"vram": reserve * GiB},
               gpus=[GPU(index=0, vram_total=total * GiB, vram_used=None if used is None else used * GiB,
                         vram_foreign=foreign * GiB)])
    assert allocatable(w, Allocated(vram={0: claimed * GiB}), margin).vram[0] == left * GiB


def _snapshot(foreign_gib: float | None, instances=()) -> ClusterSnapshot:
    gpu = GPU(index=0, name="sim", vram_total=24 * GiB, vram_foreign=None if foreign_gib is None else int(foreign_gib * GiB))
    return ClusterSnapshot(workers=[Worker(name="g1", ram_total=64 * GiB, gpus=[gpu])], instances=list(instances))


@pytest.mark.parametrize("foreign,need,margin,placed", [
    (None, 16, 0.1, True),     # nothing foreign: 24 GiB allocatable
    (10, 16, 0.1, False),      # 24 - 11 = 13 < 16: refused, naming the 10 GiB
    (10, 13, 0.1, True),       # 13 fits exactly
    (10, 14, 0.1, False),      # 14 > 13
    (10, 14, 0.0, True),       # without a margin 24 - 10 = 14 fits
])
def test_a_gpu_with_foreign_use_refuses_a_replica_that_would_otherwise_fit(foreign, need, margin, placed):
    spec = ModelSpec.model_validate({**CUSTOM, "resources": {"vram": f"{need} GiB", "ram": "1 GiB"}})
    d = decide(_snapshot(foreign), spec, FlatRequest(vram=need * GiB, ram=GiB),
               PolicyConfig(foreign_memory_margin=margin))
    assert d.scheduled is placed
    if not placed:
        text = pending_text(d.reasons, d.decisive)  # the PENDING reason: the decisive three at most
        assert "worker g1: GPU 0: 10.0 GiB used by other processes" in text, text
        assert ("11.0 GiB kept off the books with the 10% margin" in text) is (margin > 0)


def test_the_refusal_names_at_most_four_gpus():
    ws = [Worker(name=f"g{i}", ram_total=GiB, gpus=[GPU(index=0, vram_total=24 * GiB, vram_foreign=(i + 1) * GiB)])
          for i in range(6)]
    line = refusal(ws, 0.0)
    assert line.count("used by other processes") == 4  # four named, then the count of the rest
    assert line.endswith("and 2 more GPU(s) hold memory of other processes")
    assert refusal([Worker(name="g", ram_total=GiB, gpus=[GPU(index=0, vram_total=GiB)])], 0.1) is None
    assert words(int(3.2 * GiB)) == "3.2 GiB used by other processes"


def test_the_snapshots_sums_with_a_margin_equal_the_sums_made_again():
    """occupancy.allocatable_with (once per snapshot and margin, only workers with foreign use
    summed again) equals allocatable() run over every worker with the margin."""
    inst = Instance(name="a-0", model="a", worker="g1", gpu_indexes=[0], claim={"vram": {0: 5 * GiB}})
    snap = _snapshot(10, instances=[inst])
    occ = occupancy.of(snap)
    for margin in (0.0, 0.1, 0.5):
        want = {w.name: allocatable(w, Allocated(vram={0: 5 * GiB}), margin) for w in snap.workers}
        assert occ.allocatable_with(margin) == want
    assert occ.allocatable_with(0.0) == allocatable_map(snap)
    assert occ.allocatable_with(0.1)["g1"].vram[0] == 24 * GiB - 5 * GiB - 11 * GiB  # 8 GiB
    later = snap.model_copy(update={"workers": [snap.workers[0].model_copy(update={"gpus": [
        snap.workers[0].gpus[0].model_copy(update={"vram_foreign": None})]})]})
    assert occupancy.of(later).foreign == frozenset()  # the foreign use went: no worker summed again


@pytest.mark.parametrize("total,reserve,booked,foreign,degraded", [
    (24, 0, 12, 10, None),     # room 24 - 12 = 12 >= 10: fine
    (24, 0, 12, 12, None),     # exactly the room: fine
    (24, 0, 12, 13, 12),       # 13 > 12: degraded, room 12 GiB
    (24, 2, 12, 11, 10),       # room 24 - 2 - 12 = 10 < 11
    (24, 0, 0, 23, None),      # nothing of gpuflow's booked there: not gpuflow's to be squeezed
    (24, 0, 20, None, None),   # foreign unknown (the driver lists no processes): no judgement
])
def test_the_degradation_judge(total, reserve, booked, foreign, degraded):
    g = GPU(index=0, vram_total=total * GiB, vram_foreign=None if foreign is None else foreign * GiB)
    out = degradations([g], reserve * GiB, {0: booked * GiB})
    if degraded is None:
        assert out == []
    else:
        [d] = out
        assert d.room == degraded * GiB
        assert d.text().startswith(f"GPU 0: {foreign:.1f} GiB used by other processes, past the {degraded:.1f} GiB")
        assert "nothing is evicted" in d.text()


def test_a_decision_kept_before_the_margin_replays_without_it():
    from store.decision_codec import _policy

    old = PolicyConfig().model_dump()
    del old["foreign_memory_margin"]
    assert _policy(json.dumps(old)).foreign_memory_margin == 0.0
    assert _policy(PolicyConfig().model_dump_json()).foreign_memory_margin == 0.1


def test_kept_inputs_carry_the_foreign_figure_and_the_margin_and_replay_the_same():
    """A refusal on a card others use 10 GiB of, kept (store/decision_codec.py) and decoded: the
    snapshot still says 10 GiB, the policy 0.1, and the admission run again is the same, naming it."""
    from scheduler.decision_inputs import DecisionInputs, admissions
    from scheduler.tenancy.config import TenantsFile
    from scheduler.tenancy.preemption import Owners
    from store.decision_codec import Encoder, decode

    spec = ModelSpec.model_validate({**CUSTOM, "resources": {"vram": "16 GiB", "ram": "1 GiB"}})
    inp = DecisionInputs(_snapshot(10), spec, FlatRequest(vram=16 * GiB, ram=GiB), TenantsFile(), Owners({"eng": "default"}, {"eng": 0}, {}), ["eng-0"],
                         PolicyConfig(), {"g1": 1})
    enc = Encoder().encode(inp)
    back = decode(enc.manifest, enc.blobs.__getitem__)
    assert back.snapshot.workers[0].gpus[0].vram_foreign == 10 * GiB and back.policy.foreign_memory_margin == 0.1
    [was], [now] = admissions(inp), admissions(back)
    assert not was.decision.scheduled and was.decision.reasons == now.decision.reasons
    assert any("GPU 0: 10.0 GiB used by other processes" in r for r in now.decision.reasons)
