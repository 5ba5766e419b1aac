"""Learned claims in the store (store/claims.py), on SQLite and PostgreSQL: the usage reports feed
one decaying state per fingerprint, which survives a restart (a new engine on the same database),
names the deployments that use it, bumps at once on a use over the claim or an OOM, and leaves
out what it cannot learn from (no VRAM figure, a replica across hosts)."""

from __future__ import annotations

import math

from sqlmodel import Session

from contracts.usage import GpuUse, ReplicaUse, UsageBatch
from scheduler.claims.fingerprint import fingerprint
from scheduler.claims.histogram import bucket_end, bucket_of
from scheduler.claims.settings import ClaimSettings
from scheduler.units import GiB
from store import claims, db
from store.tables import InstanceRow
from tests.store_fixtures import on, store, stored_spec, want  # noqa: F401  (fixture)

SRC = "huggingface:Qwen/Qwen2.5-7B-Instruct"
GPU = "NVIDIA L4"
S = ClaimSettings(min_samples=4, min_history_s=600)
T0 = 1_800_000_000.0


def rep(name: str, used: int, claimed: int = 16 * GiB, params: str = "--max-model-len 8192 --seed 1",
        measured: str = "simulated") -> ReplicaUse:
    return ReplicaUse(instance=name, gpus=[GpuUse(index=0, used=used, peak=used, claimed=claimed)], measured=measured,
                      source=SRC, backend="vllm", parameters=params, gpu_model=GPU)


def spec(params: str = "--max-model-len 8192 --seed 1", **extra) -> dict:
    return stored_spec(SRC, "vllm", params, **extra)


def test_reports_learn_a_claim_that_survives_a_restart(store):  # noqa: F811
    url, schema, engine = store
    want(engine, "q-0", "q-1", spec=spec(backend_version="0.11.0"))
    want(engine, "r-0", spec=spec("--seed 2 --max-model-len=8192"))
    on(engine, "g1", "q-0", "q-1", "r-0")
    # q-0 and q-1 at 8 GiB, r-0 (another deployment, the same model, parameters in another order and a
    # --seed that changes no memory) at 8 GiB: one fingerprint, 3 samples a report, 2 reports 10 min apart
    for i in range(2):
        batch = UsageBatch(host="g1", replicas=[rep("q-0", 8 * GiB), rep("q-1", 8 * GiB),
                                                rep("r-0", 8 * GiB, params="--seed 2 --max-model-len=8192")])
        assert claims.observe_batch(engine, batch, S, T0 + 600 * i) == 3
    # r-0's deployment has no backend_version: its replicas are another fingerprint (the version counts)
    q = fingerprint(SRC, "vllm", "--max-model-len 8192", GPU, backend_version="0.11.0")
    r = fingerprint(SRC, "vllm", "--max-model-len 8192", GPU)
    engine.dispose()
    again = db.make_engine(url, schema=schema)  # a restart: the state is in the database
    rows = claims.learned(again, [q.key, r.key])
    assert rows[q.key].deployments == ["q"] and rows[r.key].deployments == ["r"]
    assert rows[q.key].claim_state().samples == 4 and rows[r.key].claim_state().samples == 2
    assert rows[q.key].label() == f"{SRC} vllm 0.11.0 [context=8192] on {GPU}"
    # 4 samples over 600 s: confident; p90 = 8 GiB's bucket end (8.09 GiB) x 1.15 = 9.30 GiB
    rec = claims.recommendation(again, q.key, S, T0 + 600, estimate_bytes=16 * GiB)
    assert (rec.confident, rec.claim_bytes) == (True, math.ceil(bucket_end(bucket_of(8 * GiB)) * 1.15))
    assert not claims.recommendation(again, r.key, S, T0 + 600).confident  # 2 samples < 4
    assert claims.recommendation(again, "0" * 32, S, T0) is None
    again.dispose()


def test_over_use_bumps_at_once_and_an_oom_is_told(store):  # noqa: F811
    _, _, engine = store
    want(engine, "q-0", spec=spec())
    on(engine, "g1", "q-0")
    fp = fingerprint(SRC, "vllm", "--max-model-len 8192", GPU)
    # using 10 GiB of an 8 GiB claim: bumped to 1.2 x 10 = 12 GiB at once, confident with one sample; the
    # sample's own p90 + 15% is 10 GiB's bucket end (10.50 GiB) x 1.15 = 12.07 GiB, the larger
    claims.observe_batch(engine, UsageBatch(host="g1", replicas=[rep("q-0", 10 * GiB, claimed=8 * GiB)]), S, T0)
    rec = claims.recommendation(engine, fp.key, S, T0)
    assert (rec.confident, rec.bump_bytes, rec.bump_why) == (True, math.ceil(12 * GiB), "over-use")
    assert rec.claim_bytes == math.ceil(bucket_end(bucket_of(10 * GiB)) * 1.15)
    # the agent's report after an OOM exit (oom=True) at a 12.5 GiB claim: 1.2 x 12.5 = 15 GiB at once
    oom = rep("q-0", 12 * GiB, claimed=int(12.5 * GiB)).model_copy(update={"oom": True})
    claims.observe_batch(engine, UsageBatch(host="g1", replicas=[oom]), S, T0 + 30)
    rec = claims.recommendation(engine, fp.key, S, T0 + 30)
    assert (rec.claim_bytes, rec.bump_why) == (15 * GiB, "oom")
    # an OOM told from elsewhere at a 13 GiB claim: 1.2 x 13 = 15.6 GiB
    claims.record_bump(engine, fp, 12 * GiB, 13 * GiB, T0 + 60, S, "oom", deployment="q")
    rec = claims.recommendation(engine, fp.key, S, T0 + 60)
    assert (rec.claim_bytes, rec.bump_why) == (math.ceil(13 * GiB * 1.2), "oom")
    # the estimate and the weights, told by a placement: shown, and the floor
    claims.note_estimate(engine, fp, 16 * GiB, 15 * GiB)
    rec = claims.recommendation(engine, fp.key, S, T0 + 60)
    assert (rec.estimate_bytes, rec.floor_bytes, rec.claim_bytes) == (16 * GiB, 15 * GiB, math.ceil(13 * GiB * 1.2))


def test_what_it_cannot_learn_from_is_left_out(store):  # noqa: F811
    _, _, engine = store
    want(engine, "q-0", "q-1", "q-2", spec=spec())
    on(engine, "g1", "q-0", "q-1", "q-2")
    with Session(engine) as s:  # q-2 runs across hosts: this host's figures are only its part
        row = s.get(InstanceRow, "q-2")
        row.placement = {"claim": {}, "subordinates": [{"worker": "g2"}]}
        s.add(row)
        s.commit()
    batch = UsageBatch(host="g1", replicas=[
        rep("q-0", 8 * GiB, measured="none"),  # no VRAM figure
        ReplicaUse(instance="q-1", gpus=[GpuUse(index=0, used=GiB, peak=GiB)], measured="nvml"),  # no request known
        rep("q-2", 8 * GiB)])
    assert claims.observe_batch(engine, batch, S, T0) == 0
    assert claims.all_claims(engine) == []


def test_two_hosts_first_reports_of_one_fingerprint_at_once(store):  # noqa: F811
    # both insert the row: the loser runs again and finds it; no sample is lost (5 rounds, 2 hosts each)
    import threading

    _, _, engine = store
    for round_ in range(5):
        params = f"--max-model-len {1024 * (round_ + 1)}"  # a new fingerprint each round
        want(engine, f"q{round_}-0", f"q{round_}-1", spec=spec(params))
        on(engine, "g0", f"q{round_}-0")
        on(engine, "g1", f"q{round_}-1")
        go = threading.Barrier(2)

        def host(i: int) -> None:
            go.wait()
            r = rep(f"q{round_}-{i}", 8 * GiB)
            assert claims.observe_batch(engine, UsageBatch(host=f"g{i}", replicas=[r]), S, T0) == 1

        threads = [threading.Thread(target=host, args=(i,)) for i in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        fp = fingerprint(SRC, "vllm", params, GPU)
        assert claims.learned(engine, [fp.key])[fp.key].claim_state().samples == 2


def test_a_host_speaks_only_for_its_own_replicas_as_the_store_says_them(store):  # noqa: F811
    # g1 reports q-0 (placed on g2), x-0 (no such replica) and an OOM of r-0 (another tenant's, on g2):
    # nothing is learned. Its own p-0 reported with other parameters (--max-model-len 99999) is
    # learned under the stored spec's fingerprint (8192), not the report's
    _, _, engine = store
    want(engine, "q-0", "r-0", "p-0", spec=spec())
    on(engine, "g2", "q-0", "r-0")
    on(engine, "g1", "p-0")
    oom = rep("r-0", 8 * GiB).model_copy(update={"oom": True})
    lied = rep("p-0", 8 * GiB, params="--max-model-len 99999")
    assert claims.observe_batch(engine, UsageBatch(host="g1", replicas=[rep("q-0", 8 * GiB), rep("x-0", 8 * GiB), oom]),
                                S, T0) == 0
    assert claims.all_claims(engine) == []
    assert claims.observe_batch(engine, UsageBatch(host="g1", replicas=[lied]), S, T0) == 1
    stored = fingerprint(SRC, "vllm", "--max-model-len 8192", GPU)
    assert [r.key for r in claims.all_claims(engine)] == [stored.key]


def test_a_report_says_which_claims_it_made_confident(store):  # noqa: F811
    _, _, engine = store
    want(engine, "q-0", "q-1", spec=spec())
    on(engine, "g1", "q-0", "q-1")
    key = fingerprint(SRC, "vllm", "--max-model-len 8192", GPU).key
    # 2 samples a report; the floor is 4 samples over 600 s (S)
    for i, at, expect in [(0, T0, []),  # 2 samples over 0 s
                          (1, T0 + 300, []),  # 4 samples over 300 s: under 600 s of history
                          (2, T0 + 600, [key]),  # 6 over 600 s: confident now, told once
                          (3, T0 + 900, [])]:  # confident before this report: nothing new
        became: list[str] = []
        claims.observe_batch(engine, UsageBatch(host="g1", replicas=[rep("q-0", 8 * GiB), rep("q-1", 8 * GiB)]),
                             S, at, became)
        assert became == expect, (i, became)
