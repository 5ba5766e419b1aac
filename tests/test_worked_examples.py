"""The reference's worked examples, end to end through decide() and scale_down.rank()."""

import pytest

from scheduler import scale_down
from scheduler.cluster import ModelFile
from scheduler.decide import decide
from scheduler.hf.config import ModelParameters
from scheduler.hf import claims
from scheduler.request import FlatRequest
from scheduler.spec import ModelSpec, PlacementStrategy
from scheduler.units import GiB
from tests.conftest import cluster, gpu, inst, worker


def custom_spec(name="m", **kw):
    return ModelSpec(name=name, source={"huggingface": {"repo": "org/m"}}, backend="custom", run_command="serve {port}", **kw)


def test_spread_91_5_each_then_locality_flips_to_96_5():
    # two workers each with one instance of this model (no GPU); candidates on GPU 0 of each.
    # worker: no zero-current worker -> w = 0.50 + 0.25*inv(1,1,1)=1 + 0.15*inv(0,0,0)=1 -> 0.90
    # gpu: 1/(1+0+0) = 1;  score = (0.85*0.90 + 0.15*1) * 100 = 91.5
    snap = cluster([worker("worker1", 64, [gpu(0, 24)]), worker("worker2", 64, [gpu(0, 24)])],
                   [inst("a", "m", "worker1"), inst("b", "m", "worker2")])
    spec = custom_spec()
    req = FlatRequest(vram=4 * GiB, ram=1 * GiB)
    d = decide(snap, spec, req)
    assert [round(c.score, 2) for c in d.candidates] == [91.5, 91.5]
    assert d.placement.worker == "worker1"  # tie: first in selector order
    # worker2 holds the model file: + 5 * (1/1) = 96.5 and the pick flips
    snap2 = snap.model_copy(update={"model_files": [ModelFile(worker="worker2", source="huggingface:org/m")]})
    d2 = decide(snap2, spec, req)
    assert [round(c.score, 2) for c in d2.candidates] == [91.5, 96.5]
    assert d2.placement.worker == "worker2"
    assert d2.placement.scores == {"placement": pytest.approx(91.5), "locality": pytest.approx(5.0)}


def test_binpack_27_78_vs_42_22():
    # claim 10 GiB VRAM + 1 GiB RAM on a fresh GPU 0:
    # 4090 (24.23 GiB, 125 GiB RAM): (1/125*100 + 10/24.23*100*2)/3 = (0.80 + 82.54)/3 = 27.78
    # 4080 (16376 MiB = 15.99 GiB, 62.6 GiB RAM): (1/62.6*100 + 10/15.99*100*2)/3 = (1.60 + 125.06)/3 = 42.22
    g4080 = 16376 / 1024
    snap = cluster([worker("host4090", 125, [gpu(0, 24.23)]), worker("host4080", 62.6, [gpu(0, g4080), gpu(1, g4080)])])
    d = decide(snap, custom_spec(placement_strategy="binpack"), FlatRequest(vram=10 * GiB, ram=1 * GiB))
    by = {(c.worker, c.gpu_indexes[0]): round(c.score, 2) for c in d.candidates}
    assert by == {("host4090", 0): 27.78, ("host4080", 0): 42.22, ("host4080", 1): 42.22}
    assert (d.placement.worker, d.placement.gpu_indexes) == ("host4080", [0])


def test_scale_down_110_09_vs_0_024():
    # a: RUNNING on a READY worker, GGUF fully offloaded, 10.8 GiB of an 80 GiB GPU
    #    status 100 + offload 33/33*10 = 10 + binpack removal (10.8/80*100*2/3 = 9.0) * 1/100 = 0.09
    # b: ERROR, no layer info, 2.88 GiB of an 80 GiB GPU
    #    status 0 + offload 0 + (2.88/80*100*2/3 = 2.4) * 1/100 = 0.024
    snap = cluster([worker("w1", 256, [gpu(0, 80)]), worker("w2", 256, [gpu(0, 80)])],
                   [inst("a", "m", "w1", [0], {0: int(10.8 * GiB)}, claim={"offload_layers": 33, "total_layers": 33}),
                    inst("b", "m", "w2", [0], {0: int(2.88 * GiB)}, state="error")])
    ranked = scale_down.rank(snap, "m", PlacementStrategy.BINPACK)
    assert [(r.instance.name, round(r.score, 3)) for r in ranked] == [("b", 0.024), ("a", 110.09)]


def test_scale_down_order_status_then_layers_then_placement():
    snap = cluster([worker("w1", 64, [gpu(0, 24)]), worker("w2", 64, [gpu(0, 24)]), worker("dead", 64, [gpu(0, 24)], state="not_ready")],
                   [inst("healthy", "m", "w1", [0], {0: GiB}, claim={"offload_layers": 33, "total_layers": 33}),
                    inst("partial", "m", "w2", [0], {0: GiB}, claim={"offload_layers": 10, "total_layers": 33}),
                    inst("starting", "m", "w2", [0], {0: GiB}, state="starting"),
                    inst("on-dead", "m", "dead", [0], {0: GiB}),
                    inst("broken", "m", "w1", [0], {0: GiB}, state="error")])
    names = [r.instance.name for r in scale_down.rank(snap, "m")]
    assert names[:2] == ["on-dead", "broken"] or names[:2] == ["broken", "on-dead"]
    assert names[2:] == ["starting", "partial", "healthy"]


def _qwen7b_params():
    return ModelParameters(architectures=("Qwen2ForCausalLM",), num_layers=28, num_attention_heads=28, num_kv_heads=4,
                           hidden_size=3584, head_dim=128, vocab_size=152064)


def test_vllm_single_gpu_e4():
    # weights 15.23 GiB -> claim int(15.23 GiB*1.2) + 2 GiB = 20.28 GiB.
    # 4090 (24.23 GiB): 20.28 <= 0.9*24.23 = 21.81 and 100% free -> candidate, booked 21.81 GiB.
    # 4080s (16 GiB): 20.28 > 14.4 -> no; multi-GPU is never tried because one GPU fits.
    req = FlatRequest(vram=claims.vram_claim(int(15.23 * GiB), []), params=_qwen7b_params())
    assert round(req.vram / GiB, 2) == 20.28
    snap = cluster([worker("host4090", 64, [gpu(0, 24.23)]), worker("host4080x2", 64, [gpu(i, 16) for i in range(2)]),
                    worker("host4080x4", 64, [gpu(i, 16) for i in range(4)])])
    d = decide(snap, ModelSpec(name="qwen", source={"huggingface": {"repo": "Qwen/Qwen2.5-7B"}}, backend="vllm"), req)
    assert d.strategy == "single_gpu" and len(d.candidates) == 1
    p = d.placement
    assert (p.worker, p.gpu_indexes) == ("host4090", [0])
    assert round(p.claim.vram[0] / GiB, 2) == 21.81


def test_vllm_16_gpus_over_two_workers_e5():
    # DeepSeek-R1: weights 642 GiB -> claim 642*1.2 + 2 = 772.4 GiB; an H100 host gives 8*0.9*80 = 576 GiB.
    # 4090s: too small. One H100 host: 576 < 772.4. Hosts 20 and 21 each have a busy GPU, so the
    # 8-GPU bucket's first two whole free hosts are 22 (main) and 23 (subordinate): 1152 >= 772.4.
    params = ModelParameters(architectures=("DeepseekV3ForCausalLM",), num_layers=61, num_attention_heads=128,
                             num_kv_heads=128, hidden_size=7168, head_dim=56, vocab_size=129280)
    req = FlatRequest(vram=claims.vram_claim(642 * GiB, []), params=params)
    h100 = [worker(f"host{n}-h100", 1024, [gpu(i, 80) for i in range(8)]) for n in (20, 21, 22, 23)]
    snap = cluster([worker("host4090-1", 64, [gpu(0, 24)]), worker("host4090-2", 64, [gpu(0, 24)])] + h100,
                   [inst("busy20", "other", "host20-h100", [3], {3: 40 * GiB}),
                    inst("busy21", "other", "host21-h100", [5], {5: 40 * GiB})])
    d = decide(snap, ModelSpec(name="r1", source={"huggingface": {"repo": "deepseek-ai/DeepSeek-R1"}}, backend="vllm"), req)
    assert d.strategy == "multi_worker"
    p = d.placement
    assert (p.worker, p.gpu_indexes) == ("host22-h100", list(range(8)))
    assert [(s.worker, s.gpu_indexes) for s in p.subordinates] == [("host23-h100", list(range(8)))]
    assert all(v == int(80 * GiB * 0.9) for v in p.claim.vram.values())


def test_vllm_multi_gpu_picks_a_valid_tp_size():
    # claim 30 GiB; 16 GiB GPUs booked at 14.4 GiB: 2 GPUs = 28.8 < 30; 3 GPUs = 43.2 but 28 heads % 3 != 0;
    # 4 GPUs = 57.6 and 28 % 4 == 0 -> TP 4
    req = FlatRequest(vram=30 * GiB, params=_qwen7b_params())
    snap = cluster([worker("h", 64, [gpu(i, 16) for i in range(4)])])
    d = decide(snap, ModelSpec(name="q", source={"huggingface": {"repo": "q"}}, backend="vllm"), req)
    assert d.strategy == "multi_gpu" and d.placement.gpu_indexes == [0, 1, 2, 3]


def test_sglang_books_its_mem_fraction():
    # RTX 4090 (24810 MiB): mem_fraction_static 0.848 -> books int(24810 MiB * 0.848); the claim
    # 19.02 GiB fits (<= 0.848 * 24.23 = 20.55). A 4080 (16376 MiB, 0.772 -> 12.35 GiB) cannot hold it.
    # (The fraction is sized by the smallest card of a type among the workers, as GPUStack does.)
    req = FlatRequest(vram=claims.vram_claim(15_231_233_024, []), params=_qwen7b_params())
    spec = ModelSpec(name="q", source={"huggingface": {"repo": "q"}}, backend="sglang")
    d = decide(cluster([worker("h4090", 64, [gpu(0, 24810 / 1024)])]), spec, req)
    assert d.strategy == "single_gpu"
    assert d.placement.claim.vram == {0: int(24810 * 1024**2 * 0.848)} and d.placement.claim.vram_utilization == 0.848
    d = decide(cluster([worker("h4080", 64, [gpu(0, 16376 / 1024)])]), spec, req)
    assert not d.scheduled and any("cuda 0.772" in r for r in d.reasons)
