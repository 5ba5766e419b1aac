"""The learned claim a new placement books (issue 42): the store's learned claims
(store/claims.py) for a spec, through the pure rule (scheduler/claim_apply.py), on the place
activity's path (activities/placement.py) before the replica joins a batch.

The GPU a replica lands on is not known before the decision, and a fingerprint names its GPU
model (scheduler/claims/fingerprint.py): so every fingerprint of the spec (its source, engine,
memory parameters and engine version, on any GPU model) is read, and the largest claim that is
confident (or bumped after an OOM or use over the claim) is the one booked; a GPU model that has
learned less is not trusted to speak for another. Each fingerprint found is told the estimate
(store/claims.note_estimate: ``gpuflow claims`` shows them side by side)."""

from __future__ import annotations

import logging
import time

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from scheduler.claim_apply import applied, mode_of
from scheduler.claims.fingerprint import of_spec
from scheduler.claims.recommender import Recommendation, recommend
from scheduler.claims.settings import ClaimSettings
from scheduler.learned_claim import LearnedClaim
from scheduler.request import FlatRequest, Request
from scheduler.spec import ModelSpec
from store import claims as store_claims

log = logging.getLogger("gpuflow.claims")


def learned_of(rec: Recommendation, key: str, estimate: int) -> LearnedClaim:
    """The recommender's word as the state a decision keeps (scheduler/learned_claim.py)."""
    return LearnedClaim(claim=int(rec.claim_bytes or 0), estimate=estimate, fingerprint=key, samples=rec.samples,
                        span_s=float(rec.span_s), percentile=float(rec.percentile), margin=float(rec.margin),
                        value=int(rec.percentile_bytes or 0), confidence=float(rec.confidence),
                        bumped=bool(rec.bump_bytes and rec.bump_bytes >= (rec.claim_bytes or 0)),
                        floor=int(rec.floor_bytes))


class ClaimsReader:
    def __init__(self, engine: Engine, reads: Engine, settings: ClaimSettings | None = None, clock=time.time):
        """``engine``: where estimates are noted; ``reads``: where the learned claims are read."""
        self.engine, self.reads, self.settings, self.clock = engine, reads, settings or ClaimSettings(), clock

    def mode(self, spec: ModelSpec) -> str:
        return mode_of(spec.claims.value if spec.claims else None, self.settings.mode.value)

    def best(self, spec: ModelSpec, req: FlatRequest) -> LearnedClaim | None:
        """The largest confident learned claim of ``spec``'s fingerprints (any GPU model), or None."""
        fp = of_spec(spec, "")
        with Session(self.reads) as s:
            rows = list(s.exec(select(store_claims.ClaimRow).where(
                store_claims.ClaimRow.source == fp.source, store_claims.ClaimRow.backend == fp.backend,
                store_claims.ClaimRow.params == fp.params_text,
                store_claims.ClaimRow.backend_version == fp.backend_version)))
        now, out = self.clock(), None
        for row in rows:
            rec = recommend(row.claim_state(), self.settings, now, estimate_bytes=req.vram,
                            weights_bytes=max(req.weight_bytes or 0, row.weights))
            if rec.confident and rec.claim_bytes and (out is None or rec.claim_bytes > out.claim):
                out = learned_of(rec, row.key, req.vram)
            if row.estimate != req.vram:
                self._note(row, req)
        return out

    def _note(self, row, req: FlatRequest) -> None:
        try:
            store_claims.note_estimate(self.engine, row.fingerprint(), req.vram, req.weight_bytes or 0)
        except Exception as e:  # noqa: BLE001  (a note shown beside the claim; never fails a placement)
            log.warning("claims: the estimate of %s not noted: %s: %s", row.key, type(e).__name__, e)

    def apply(self, spec: ModelSpec, req: Request) -> Request:
        """The request this spec's new placement books (scheduler/claim_apply.py applied), with why logged."""
        mode = self.mode(spec)
        if spec.is_group or not isinstance(req, FlatRequest):
            return req
        got, why = applied(req, spec.backend.value, list(spec.backend_parameters), self.best(spec, req), mode)
        if got is not req:
            log.info("claims: %s: %s", spec.name, why)
        return got
