"""The learned claim a placement books, read from a real store (activities/claims_read.py over
store/claims.py), on SQLite and PostgreSQL: every fingerprint of the spec on any GPU model is read,
the largest confident one wins, a learning one does not count, advise books the estimate, and
each fingerprint found is told the estimate.

Settings of every case: MIN_SAMPLES 4, MIN_HISTORY_S 600; samples 10 minutes apart."""

from __future__ import annotations

from activities.claims_read import ClaimsReader
from contracts.usage import GpuUse, ReplicaUse, UsageBatch
from scheduler.claims.fingerprint import of_spec
from scheduler.claims.settings import ClaimMode, ClaimSettings
from scheduler.request import FlatRequest
from scheduler.spec import ModelSpec
from scheduler.units import GiB
from store import claims
from tests.store_fixtures import on, store, want  # noqa: F401  (fixture)

T0 = 1_800_000_000.0
S = ClaimSettings(min_samples=4, min_history_s=600, mode=ClaimMode.ADVISE)
SPEC = ModelSpec(name="q", source={"local_path": "/models/q"}, backend="custom", run_command="serve {port}",
                 resources={"vram": 14 * GiB, "ram": GiB})
EST = FlatRequest(vram=14 * GiB, ram=GiB, weight_bytes=2 * GiB)


def feed(engine, gpu_model: str, used: int, reports: int) -> None:
    for k in range(reports):
        r = ReplicaUse(instance="q-0", measured="simulated", source=SPEC.source.key, backend="custom",
                       gpu_model=gpu_model, gpus=[GpuUse(index=0, used=used, peak=used, claimed=14 * GiB)])
        claims.observe_batch(engine, UsageBatch(host="h", replicas=[r]), S, T0 + 600 * k)


def test_the_largest_confident_claim_over_gpu_models_is_booked(store):  # noqa: F811
    _, _, engine = store
    want(engine, "q-0", spec=SPEC.model_dump(mode="json"))
    on(engine, "h", "q-0")
    feed(engine, "GPU A", 6 * GiB, 5)  # 5 samples over 40 min: confident, ~6.9 GiB
    feed(engine, "GPU B", 8 * GiB, 5)  # confident, ~9.2 GiB: the larger wins
    feed(engine, "GPU C", 12 * GiB, 2)  # 2 samples: learning, not trusted whatever its size
    reader = ClaimsReader(engine, engine, S.model_copy(update={"mode": ClaimMode.APPLY}), clock=lambda: T0 + 3000)
    got = reader.apply(SPEC, EST)
    assert 8 * GiB < got.vram < 10 * GiB and got.learned.fingerprint == of_spec(SPEC, "GPU B").key
    assert got.learned.estimate == 14 * GiB and got.learned.samples == 5
    # each fingerprint found was told the estimate and the weights (gpuflow claims shows them)
    rows = claims.learned(engine, [of_spec(SPEC, m).key for m in ("GPU A", "GPU B", "GPU C")])
    assert {(r.estimate, r.weights) for r in rows.values()} == {(14 * GiB, 2 * GiB)}


def test_advise_and_a_spec_override(store):  # noqa: F811
    _, _, engine = store
    want(engine, "q-0", spec=SPEC.model_dump(mode="json"))
    on(engine, "h", "q-0")
    feed(engine, "GPU A", 6 * GiB, 5)
    advise = ClaimsReader(engine, engine, S, clock=lambda: T0 + 3000)
    assert advise.apply(SPEC, EST) is EST  # the cluster advises: the estimate
    got = advise.apply(ModelSpec.model_validate({**SPEC.model_dump(), "claims": "apply"}), EST)  # the spec's claims: apply wins
    assert got.learned is not None and got.vram < 14 * GiB


def test_nothing_learned_books_the_estimate(store):  # noqa: F811
    _, _, engine = store
    reader = ClaimsReader(engine, engine, S.model_copy(update={"mode": ClaimMode.APPLY}), clock=lambda: T0)
    assert reader.apply(SPEC, EST) is EST
