"""Learned memory claims in the store (issue 42): per fingerprint (scheduler/claims/fingerprint.py)
the recommender's state (``ClaimState``: the decaying histogram of measured peaks, the sample count
and span, the bump after an OOM or over-use), kept as JSON in ``gpuflow_claims`` so it survives
restarts; bounded (the histogram has at most 205 buckets, the deployments list DEPLOYMENTS names).

Fed by the usage reports the agents already send (``observe_batch``, from the activity
``record_usage`` right after store/usage.py's ``record``): one sample per replica per report,
its measured VRAM peak (the sum over its cards); a replica whose use is over its claim on a card,
or whose report says it ended out of GPU memory (``ReplicaUse.oom``), bumps the claim at once.
``record_bump`` tells one from elsewhere. Read by the placement
(``learned``/``recommendation``) and by ``gpuflow claims`` (views/claims.py).

A replica placed across hosts (a subordinate part elsewhere) is left out: each host reports only
its own part, and a part is not what a replica of the fingerprint uses."""

from __future__ import annotations

from datetime import datetime

from pydantic import ValidationError
from sqlalchemy import BigInteger, Column, JSON, Text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, SQLModel, select

from contracts.usage import ReplicaUse, UsageBatch
from scheduler.claims.fingerprint import Fingerprint, of_spec
from scheduler.claims.recommender import Recommendation, recommend, sure
from scheduler.claims.settings import ClaimSettings
from scheduler.claims.state import ClaimState, bump, observe, over_claim
from scheduler.spec import ModelSpec
from store.tables import DeploymentRow, InstanceRow, utcnow

DEPLOYMENTS = 32  # deployments named per fingerprint, the latest first


class ClaimRow(SQLModel, table=True):
    """One fingerprint's learned claim: what it is, who uses it, and the recommender's state."""

    __tablename__ = "gpuflow_claims"
    key: str = Field(primary_key=True)  # Fingerprint.key
    source: str = ""
    digest: str = ""
    backend: str = ""
    backend_version: str = ""
    params: str = Field(default="", sa_column=Column(Text, nullable=False, default=""))  # Fingerprint.params_text
    gpu_model: str = ""
    deployments: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    state: dict = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))  # ClaimState, as JSON
    claimed: int = Field(default=0, sa_type=BigInteger)  # what the last replica measured was booked
    estimate: int = Field(default=0, sa_type=BigInteger)  # the estimate, where a placement told it (0: not told)
    weights: int = Field(default=0, sa_type=BigInteger)  # the weights' size, likewise: the claim's floor
    updated_at: datetime = Field(default_factory=utcnow)

    def claim_state(self) -> ClaimState:
        return ClaimState.model_validate(self.state or {})

    def label(self) -> str:
        return self.fingerprint().label()

    def fingerprint(self) -> Fingerprint:
        params = tuple(tuple(p.split("=", 1)) if "=" in p else (p, "on") for p in self.params.split())
        return Fingerprint(source=self.source, backend=self.backend, params=params, gpu_model=self.gpu_model,
                           backend_version=self.backend_version, digest=self.digest)


def _lock(engine: Engine, stmt):
    """Rows a batch updates are locked on PostgreSQL (two hosts' reports for one fingerprint
    would otherwise lose a sample); SQLite's writers hold the database lock already."""
    return stmt.with_for_update() if engine.dialect.name == "postgresql" else stmt


def _spec(raw) -> ModelSpec | None:
    try:
        return ModelSpec.model_validate(raw) if isinstance(raw, dict) else None
    except ValidationError:
        return None


def _owners(s: Session, names: list[str], host: str) -> dict[str, tuple[str, ModelSpec]]:
    """instance -> (deployment, its spec as the store keeps it), for the instances the store places
    on ``host`` alone: a host's report speaks only for what it was given to run, and what it ran is
    the stored spec's, not the report's words. Placed across hosts, on another host, or unknown:
    left out."""
    rows = list(s.exec(select(InstanceRow).where(InstanceRow.name.in_(names)))) if names else []
    rows = [r for r in rows if r.worker == host and not (r.placement or {}).get("subordinates")]
    deps = {r.deployment for r in rows}
    specs = {d.name: _spec(d.spec) for d in s.exec(select(DeploymentRow).where(DeploymentRow.name.in_(deps)))} \
        if deps else {}
    return {r.name: (r.deployment, specs[r.deployment]) for r in rows if specs.get(r.deployment) is not None}


def _row_for(fp: Fingerprint) -> ClaimRow:
    return ClaimRow(key=fp.key, source=fp.source, digest=fp.digest, backend=fp.backend,
                    backend_version=fp.backend_version, params=fp.params_text, gpu_model=fp.gpu_model)


def _over(r: ReplicaUse) -> bool:
    return any(over_claim(g.used, g.claimed or 0) for g in r.gpus)


def observe_batch(engine: Engine, batch: UsageBatch, settings: ClaimSettings, now: float,
                  became: list[str] | None = None) -> int:
    """One host's report into the learned claims, in one transaction; returns the samples taken.
    ``became`` gets the fingerprints whose history passed the confidence floor with this report
    (a PENDING replica may fit with the learned claim now). Two hosts' first reports of one
    fingerprint may both insert its row (PostgreSQL locks only rows that exist): the loser's
    transaction is rolled back and run again, finding the row."""
    try:
        return _observe(engine, batch, settings, now, became)
    except IntegrityError:
        if became is not None:
            became.clear()  # that transaction was rolled back: the retry tells again
        return _observe(engine, batch, settings, now, became)


def _observe(engine: Engine, batch: UsageBatch, settings: ClaimSettings, now: float,
             became: list[str] | None = None) -> int:
    usable = [r for r in batch.replicas if r.measured != "none" and r.backend and r.gpu_model and r.vram_peak > 0]
    if not usable:
        return 0
    taken = 0
    with Session(engine) as s:
        owners = _owners(s, [r.instance for r in usable], batch.host)
        seen: dict[str, tuple[Fingerprint, list[tuple[ReplicaUse, str]]]] = {}
        for r in usable:
            if r.instance not in owners:
                continue
            deployment, spec = owners[r.instance]
            fp = of_spec(spec, r.gpu_model)
            seen.setdefault(fp.key, (fp, []))[1].append((r, deployment))
        if not seen:
            return 0
        rows = {x.key: x for x in s.exec(_lock(engine, select(ClaimRow).where(ClaimRow.key.in_(list(seen)))))}
        for key, (fp, reps) in seen.items():
            row = rows.get(key) or _row_for(fp)
            state, deps = row.claim_state(), list(row.deployments or [])
            before = sure(state, settings)
            for r, deployment in reps:
                state = observe(state, r.vram_peak, now, settings)
                if r.oom:  # it ended out of GPU memory: these are its last figures
                    state = bump(state, r.vram_used, r.vram_claimed, now, settings, "oom")
                elif _over(r):
                    state = bump(state, r.vram_used, r.vram_claimed, now, settings, "over-use")
                if deployment:
                    deps = [deployment] + [d for d in deps if d != deployment]
                row.claimed = reps[-1][0].vram_claimed or row.claimed
                taken += 1
            row.state, row.deployments, row.updated_at = state.model_dump(mode="json"), deps[:DEPLOYMENTS], utcnow()
            s.add(row)
            if became is not None and not before and sure(state, settings):
                became.append(key)
        s.commit()
    return taken


def record_bump(engine: Engine, fp: Fingerprint, used: int, claim: int, now: float, settings: ClaimSettings,
                why: str = "oom", deployment: str = "") -> ClaimState:
    """An OOM (or a use over the claim seen elsewhere): the fingerprint's claim bumped at once."""
    with Session(engine) as s:
        row = s.exec(_lock(engine, select(ClaimRow).where(ClaimRow.key == fp.key))).first() or _row_for(fp)
        state = bump(row.claim_state(), used, claim, now, settings, why)
        row.state, row.updated_at = state.model_dump(mode="json"), utcnow()
        if deployment:
            row.deployments = ([deployment] + [d for d in row.deployments or [] if d != deployment])[:DEPLOYMENTS]
        s.add(row)
        s.commit()
    return state


def note_estimate(engine: Engine, fp: Fingerprint, estimate: int, weights: int = 0) -> None:
    """What a placement estimated for this fingerprint (and the weights' size): shown beside the
    learned claim, and the floor. Written only when it changed."""
    with Session(engine) as s:
        row = s.get(ClaimRow, fp.key) or _row_for(fp)
        if (row.estimate, row.weights) == (estimate, weights):
            return
        row.estimate, row.weights, row.updated_at = estimate, weights or row.weights, utcnow()
        s.add(row)
        s.commit()


def learned(engine: Engine, keys: list[str]) -> dict[str, ClaimRow]:
    """The rows of these fingerprints (absent: nothing learned)."""
    if not keys:
        return {}
    with Session(engine) as s:
        return {r.key: r for r in s.exec(select(ClaimRow).where(ClaimRow.key.in_(list(keys))))}


def recommendation(engine: Engine, key: str, settings: ClaimSettings, now: float, estimate_bytes: int | None = None,
                   weights_bytes: int = 0) -> Recommendation | None:
    """The recommender's word on one fingerprint now (None: nothing measured for it)."""
    row = learned(engine, [key]).get(key)
    if row is None:
        return None
    return recommend(row.claim_state(), settings, now, estimate_bytes=estimate_bytes if estimate_bytes is not None
                     else (row.estimate or None), weights_bytes=max(weights_bytes, row.weights))


def all_claims(engine: Engine) -> list[ClaimRow]:
    with Session(engine) as s:
        return list(s.exec(select(ClaimRow).order_by(ClaimRow.source, ClaimRow.backend, ClaimRow.gpu_model)))
