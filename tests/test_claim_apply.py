"""Learned claims applied (scheduler/claim_apply.py, issue 42): mode advise against apply as tables,
on the real policy (scheduler/decide.py), the vLLM/SGLang booking of a learned claim, and the
engines' arguments that tell them the booked claim (worker_agent/engines.py).

Cluster of every row: one worker with one 24 GiB GPU. The estimate asks 14 GiB a replica; the
learned claim (p90 6.0 GiB + 15% = 6.9 GiB) asks 6.9 GiB."""

from __future__ import annotations

import pytest

from contracts.agent import LaunchRequest
from scheduler.claim_apply import APPLY, ADVISE, applied, even_shares, is_oom, learned_text, mode_of
from scheduler.decide import decide
from scheduler.errors import InvalidInput
from scheduler.learned_claim import LearnedClaim
from scheduler.request import FlatRequest, GGUFRequest
from scheduler.request_codec import decode, encode
from scheduler.spec import ModelSpec
from scheduler.units import GiB, MiB
from tests.conftest import cluster, gpu, inst, worker
from worker_agent.engines import EngineConfig, sglang_argv, vllm_argv

EST = FlatRequest(vram=14 * GiB, ram=GiB, weight_bytes=4 * GiB)
LEARNED = LearnedClaim(claim=int(6.9 * GiB), estimate=14 * GiB, fingerprint="fp", samples=40, span_s=900.0,
                       value=6 * GiB, confidence=1.0)


def custom(**kw) -> ModelSpec:
    return ModelSpec(name="m", source={"huggingface": {"repo": "org/m"}}, backend="custom", run_command="x {port}", **kw)


def vllm(*params: str) -> ModelSpec:
    return ModelSpec(name="m", source={"huggingface": {"repo": "org/m"}}, backend="vllm",
                     backend_parameters=list(params))


@pytest.mark.parametrize("spec_mode,cluster_mode,want", [
    (None, "advise", ADVISE),     # the cluster's mode when the spec says nothing
    (None, "apply", APPLY),
    ("advise", "apply", ADVISE),  # the spec's claims wins
    ("apply", "advise", APPLY),
])
def test_mode_of(spec_mode, cluster_mode, want):
    assert mode_of(spec_mode, cluster_mode) == want


def test_mode_of_refuses_an_unknown_mode():
    with pytest.raises(InvalidInput, match="'auto' is not one of advise, apply"):
        mode_of(None, "auto")


@pytest.mark.parametrize("mode,learned,backend,params,vram,why", [
    # advise never changes what is booked, learned or not
    (ADVISE, None, "custom", [], 14 * GiB, "claims advise: the estimate is booked"),
    (ADVISE, LEARNED, "custom", [], 14 * GiB, "the learned claim would be 6.9 GiB"),
    # apply: the learned claim (6.9 GiB) in place of the estimate (14 GiB)
    (APPLY, LEARNED, "custom", [], int(6.9 * GiB), "claim 6.9 GiB learned from 40 samples over 15 minutes"),
    (APPLY, LEARNED, "vllm", [], int(6.9 * GiB), "the estimate was 14.0 GiB"),
    # apply without a confident claim yet: the estimate
    (APPLY, None, "custom", [], 14 * GiB, "no confident learned claim yet"),
    # the spec fixes the engine's share itself: that share, not the learned claim
    (APPLY, LEARNED, "vllm", ["--gpu-memory-utilization", "0.5"], 14 * GiB, "the spec sets --gpu-memory-utilization"),
    (APPLY, LEARNED, "sglang", ["--mem-fraction-static=0.5"], 14 * GiB, "the spec sets --mem-fraction-static"),
])
def test_applied(mode, learned, backend, params, vram, why):
    got, said = applied(EST, backend, params, learned, mode)
    assert got.vram == vram and why in said
    assert (got.learned is not None) == (vram != EST.vram)


def test_a_learned_claim_never_falls_below_the_weights():
    # learned 3 GiB, weights 4 GiB: max(3, 4) = 4 GiB booked, and explain says it was held there
    low = LearnedClaim(claim=3 * GiB, estimate=14 * GiB, samples=40, span_s=900.0, value=2 * GiB)
    got, said = applied(EST, "custom", [], low, APPLY)
    assert got.vram == 4 * GiB and got.learned.floor == 4 * GiB
    assert "held at the weights' 4.0 GiB" in said


def test_a_gguf_request_keeps_its_estimate():
    req = GGUFRequest(model=None, options=None, items=[])
    got, said = applied(req, "llama.cpp", [], LEARNED, APPLY)
    assert got is req and "per offloaded layer" in said


def test_a_bumped_claim_says_so():
    bumped = LearnedClaim(claim=int(16.8 * GiB), estimate=14 * GiB, bumped=True)  # max(14 x 1.2, 14 + 0.1) = 16.8
    assert learned_text(bumped) == ("claim 16.8 GiB raised at once after an OOM or use over the claim; "
                                    "the estimate was 14.0 GiB")


def test_the_learned_state_is_kept_with_the_request():
    # the decision's kept inputs encode the request: the learned state travels with it and decodes the same
    req, _ = applied(EST, "custom", [], LEARNED, APPLY)
    d = encode(req)
    assert d["learned"]["samples"] == 40 and d["learned"]["estimate"] == 14 * GiB
    assert req.basis == "claim 6.9 GiB learned from 40 samples over 15 minutes (p90 6.0 GiB + 15%); the estimate was 14.0 GiB"
    assert decode(d) == req
    assert "learned" not in encode(EST)  # an estimate's request encodes as before (its digest unchanged)
    with pytest.raises(InvalidInput, match="samples is not a int"):
        decode({**d, "learned": {**d["learned"], "samples": "many"}})


# Mode advise against apply on the policy: two replicas of 14 GiB (estimate) or 6.9 GiB (learned) on 24 GiB.
# First replica placed; the second fits only under apply: 24 - 6.9 = 17.1 >= 6.9, but 24 - 14 = 10 < 14.
@pytest.mark.parametrize("mode,second_fits", [(ADVISE, False), (APPLY, True)])
def test_two_to_a_gpu_only_under_apply(mode, second_fits):
    req, _ = applied(EST, "custom", [], LEARNED, mode)
    spec = custom()
    first = decide(cluster([worker("w", 64, [gpu(0, 24)])]), spec, req)
    assert first.scheduled
    booked = first.placement.claim.vram[0]
    assert booked == req.vram
    snap = cluster([worker("w", 64, [gpu(0, 24)])], [inst("m-0", "m", "w", [0], {0: booked}, ram=req.ram)])
    assert decide(snap, spec, req).scheduled is second_fits


def test_advise_changes_no_placement():
    # the same snapshot decided with and without a learned claim under advise: the same decision
    snap = cluster([worker("w", 64, [gpu(0, 24), gpu(1, 48)])], [inst("o-0", "o", "w", [1], {1: 20 * GiB})])
    plain = decide(snap, custom(), applied(EST, "custom", [], None, ADVISE)[0])
    advised = decide(snap, custom(), applied(EST, "custom", [], LEARNED, ADVISE)[0])
    assert plain.placement.to_dict() == advised.placement.to_dict()
    assert [c.to_dict() for c in plain.candidates] == [c.to_dict() for c in advised.candidates]


@pytest.mark.parametrize("claim,totals,share,frac", [
    # one 80 GiB card: 6.9 GiB rounded up to a MiB; 6.9/80 = 0.08625 -> floor to 4 decimals 0.0862
    (int(6.9 * GiB), [80 * GiB], 7066 * MiB, 0.0862),
    # two 24 GiB cards: 10 GiB / 2 = 5 GiB each; 5/24 = 0.20833 -> 0.2083
    (10 * GiB, [24 * GiB, 24 * GiB], 5 * GiB, 0.2083),
    # a 24 and a 48 GiB card: the fraction on the larger card (5/48 = 0.10416 -> 0.1041) so none takes more
    (10 * GiB, [24 * GiB, 48 * GiB], 5 * GiB, 0.1041),
])
def test_even_shares(claim, totals, share, frac):
    assert even_shares(claim, totals) == (share, frac)


def test_vllm_books_the_learned_claim_not_the_cards_fraction():
    # estimate: vLLM books 0.9 x 24 = 21.6 GiB; learned: 6.9 GiB (7066 MiB), told as 7066/24576 = 0.2875 -> 0.2875
    snap = cluster([worker("w", 64, [gpu(0, 24)])])
    est = decide(snap, vllm(), EST)
    assert est.placement.claim.vram == {0: int(24 * GiB * 0.9)} and est.placement.claim.vram_utilization == 0.9
    req, _ = applied(EST, "vllm", [], LEARNED, APPLY)
    got = decide(snap, vllm(), req)
    assert got.placement.claim.vram == {0: 7066 * MiB} and got.placement.claim.vram_utilization == 0.2875
    # so a second replica fits beside it: 24 - 6.9 >= 6.9; under the estimate 24 x 0.1 left < 14
    snap2 = cluster([worker("w", 64, [gpu(0, 24)])], [inst("m-0", "m", "w", [0], {0: 7066 * MiB})])
    assert decide(snap2, vllm(), req).scheduled


def test_sglang_with_tensor_parallelism_books_equal_shares():
    # TP 2 over two 24 GiB cards: 6.9 GiB -> 3533 MiB each (3532.8 rounded up), 3533/24576 = 0.14376 -> 0.1437
    snap = cluster([worker("w", 64, [gpu(0, 24), gpu(1, 24)])])
    spec = ModelSpec(name="m", source={"huggingface": {"repo": "org/m"}}, backend="sglang",
                     backend_parameters=["--tp-size", "2"])
    req, _ = applied(EST, "sglang", spec.backend_parameters, LEARNED, APPLY)
    got = decide(snap, spec, req)
    assert got.placement.claim.vram == {0: 3533 * MiB, 1: 3533 * MiB} and got.placement.claim.vram_utilization == 0.1437


def launch(backend: str, util: float | None, params=()) -> LaunchRequest:
    return LaunchRequest(instance="m-0", model="m", backend=backend, gpu_indexes=[0], model_path="/models/m",
                         vram_utilization=util, backend_parameters=list(params))


# The engines' arguments: the fraction of the card the booked claim is (the selectors' vram_utilization).
@pytest.mark.parametrize("backend,util,params,want", [
    ("vllm", 0.2875, [], ["--gpu-memory-utilization", "0.2875"]),      # a learned claim of 6.9 GiB on 24 GiB
    ("vllm", 0.9, [], ["--gpu-memory-utilization", "0.9000"]),         # the estimate: the card's fraction
    ("vllm", None, [], []),                                             # custom-like booking: no flag
    ("sglang", 0.1437, [], ["--mem-fraction-static", "0.1437"]),
])
def test_engine_arguments(backend, util, params, want):
    argv = (vllm_argv(launch(backend, util, params), 8000, EngineConfig()) if backend == "vllm"
            else sglang_argv(launch(backend, util, params), 9000, EngineConfig()))
    flag = "--gpu-memory-utilization" if backend == "vllm" else "--mem-fraction-static"
    got = argv[argv.index(flag):argv.index(flag) + 2] if flag in argv else []
    assert got == want


def test_vllm_kv_cache_bytes_stay_gpuflows():
    # --kv-cache-memory-bytes would let an engine take a KV cache past the booked share: owned, refused in a spec
    with pytest.raises(ValueError, match="kv-cache-memory-bytes"):
        vllm("--kv-cache-memory-bytes", "1000000")


@pytest.mark.parametrize("why,oom", [
    ("exited with code -9: torch.OutOfMemoryError: CUDA out of memory (simulated): tried to hold 9.0 GiB", True),
    ("exited with code 1: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", True),
    ("exited with code 1: ValueError: No available memory for the cache blocks", False),
    ("oom", False),  # a bare word is not the engine's message
])
def test_is_oom(why, oom):
    assert is_oom(why) is oom
