"""Every placement decision, with what its policy saw, kept so it can be re-run
(activities/decision_inputs.py encodes the inputs; ``gpuflow explain --replay`` and
bench/replay_all.py replay them).

- ``gpuflow_decision_blobs``: content-addressed parts (snapshot chunks, specs, requests, tenants,
  manifests), zlib-compressed, keyed by the SHA-256 of their bytes (a chunk: of its rows' digests).
  Written once, shared by every decision that saw them.
- ``gpuflow_decisions``: one row per replica decided: when, which replica, the outcome, its
  decisive reason, the manifest's digest (the record in the workflow history carries the same
  digest) and the record itself (compressed), to compare a replay against; and one per autoscaler
  step that voted or moved (kind ``autoscale``: its inputs one blob, its decision the record); and one per
  member of a prefill/decode group decided (kind ``group``: its formation, every member's row naming the
  same manifest; ``scale_out``: a member placed alone after it).

``prune`` keeps the last ``keep_days`` and, always, the newest decision that placed each replica the
store still shows; then it drops the blobs no kept decision names."""

from __future__ import annotations

import hashlib
import json
import zlib
from datetime import datetime, timedelta
from typing import Any, Iterator

from sqlalchemy import Column, LargeBinary, delete, func
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, SQLModel, select

from store.tables import InstanceRow, utcnow

PLACING = ("placed", "preempting")
MANIFESTS = ("placement", "group", "scale_out")  # the kinds whose digest names a manifest of parts


class DecisionBlobRow(SQLModel, table=True):
    __tablename__ = "gpuflow_decision_blobs"
    digest: str = Field(primary_key=True, max_length=64)
    data: bytes = Field(sa_column=Column(LargeBinary, nullable=False))  # zlib
    size: int = 0  # uncompressed bytes


class DecisionRow(SQLModel, table=True):
    __tablename__ = "gpuflow_decisions"
    id: int | None = Field(default=None, primary_key=True)
    kind: str = "placement"  # placement | autoscale (activities/autoscale_inputs.py) | group | scale_out (a group member's)
    digest: str = Field(index=True, max_length=64)  # the inputs': a placement's manifest, an autoscaler step's blob
    instance: str = Field(index=True)  # the replica decided; an autoscaler step: its deployment
    deployment: str = Field(index=True)
    outcome: str = ""  # placed | preempting | refused | over_quota; an autoscaler step: up | down | hold
    reason: str = ""  # the decisive reason (refused), or where it went
    record: bytes = Field(sa_column=Column(LargeBinary, nullable=False))  # zlib of the DecisionRecord's JSON (a step's decision)
    at: datetime = Field(default_factory=utcnow, index=True)
    record_digest: str | None = Field(default=None, max_length=64)  # SHA-256 of the record's JSON (None: kept before it)


class Damaged(ValueError):
    """A kept part that is not what was written: not zlib data, or bytes that do not hash to the digest
    it is kept under. Named, never a traceback: ``gpuflow explain --replay`` says which part."""


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _unzip(data: bytes, what: str) -> bytes:
    try:
        return zlib.decompress(data)
    except zlib.error as e:
        raise Damaged(f"{what} is damaged: it is not zlib data ({e})") from None


def outcome_of(rec) -> str:
    return ("over_quota" if rec.quota else "preempting" if rec.victims else "placed" if rec.scheduled
            else "refused")


def reason_of(rec) -> str:
    if rec.scheduled and rec.plan is not None:
        return f"{rec.plan.worker} GPU {','.join(map(str, rec.plan.gpu_indexes)) or '-'}"
    return rec.reasons[0] if rec.reasons else ""


def write(engine: Engine, blobs: dict[str, bytes], rows: list[DecisionRow]) -> int:
    """Store the blobs not stored yet and the decision rows, in one transaction; the blobs' bytes
    written (compressed)."""
    written = 0
    with Session(engine) as s:
        if blobs:
            have: set[str] = set()
            keys = sorted(blobs)
            for i in range(0, len(keys), 500):
                have |= set(s.exec(select(DecisionBlobRow.digest).where(DecisionBlobRow.digest.in_(keys[i:i + 500]))))
            for k in keys:
                if k not in have:
                    data = zlib.compress(blobs[k], 6)
                    written += len(data)
                    s.add(DecisionBlobRow(digest=k, data=data, size=len(blobs[k])))
        for r in rows:
            s.add(r)
        try:
            s.commit()
        except IntegrityError:  # another control worker stored one of the same blobs meanwhile
            s.rollback()
            return _write_one_by_one(engine, blobs, rows)
    return written


def _write_one_by_one(engine: Engine, blobs: dict[str, bytes], rows: list[DecisionRow]) -> int:
    written = 0
    for k, v in blobs.items():
        with Session(engine) as s:
            if s.get(DecisionBlobRow, k) is None:
                data = zlib.compress(v, 6)
                s.add(DecisionBlobRow(digest=k, data=data, size=len(v)))
                try:
                    s.commit()
                    written += len(data)
                except IntegrityError:
                    s.rollback()
    with Session(engine) as s:
        for r in rows:
            s.add(DecisionRow(**r.model_dump(exclude={"id"})))
        s.commit()
    return written


def blob(engine: Engine, digest: str) -> bytes:
    """A blob's bytes; KeyError when it is not kept, Damaged when they are not zlib data."""
    with Session(engine) as s:
        row = s.get(DecisionBlobRow, digest)
        if row is None:
            raise KeyError(digest)
        return _unzip(row.data, f"kept blob {digest[:12]}")


def manifest(engine: Engine, digest: str) -> bytes:
    """A decision's manifest, checked against the digest it is kept under (the digest the workflow's
    record names): KeyError when not kept, Damaged when altered."""
    data = blob(engine, digest)
    if digest_of(data) != digest:
        raise Damaged(f"the manifest {digest[:12]} was altered: its bytes hash to {digest_of(data)[:12]}")
    return data


def record_of(row: DecisionRow) -> dict[str, Any]:
    """The decision's record as kept, checked against its digest (rows kept before digests: unchecked);
    Damaged when it is not zlib, altered, or not JSON."""
    what = f"the kept record of decision {row.id} ({row.instance})"
    data = _unzip(row.record, what)
    if row.record_digest and digest_of(data) != row.record_digest:
        raise Damaged(f"{what} was altered: it hashes to {digest_of(data)[:12]}, kept as {row.record_digest[:12]}")
    try:
        return json.loads(data)
    except ValueError:
        raise Damaged(f"{what} is damaged: it is not JSON") from None


def latest(engine: Engine, instance: str, digest: str | None = None) -> DecisionRow | None:
    """The instance's newest decision (with ``digest``: the newest with those inputs)."""
    with Session(engine) as s:
        q = select(DecisionRow).where(DecisionRow.instance == instance)
        if digest:
            q = q.where(DecisionRow.digest.startswith(digest, autoescape=True))  # '%' and '_' are literal
        return s.exec(q.order_by(DecisionRow.id.desc()).limit(1)).first()


def history(engine: Engine, deployment: str, limit: int = 200) -> list[DecisionRow]:
    """The deployment's decisions, oldest first (the last ``limit``)."""
    with Session(engine) as s:
        rows = list(s.exec(select(DecisionRow).where(DecisionRow.deployment == deployment)
                           .order_by(DecisionRow.id.desc()).limit(limit)))
    return rows[::-1]


def replica_of(engine: Engine, name: str) -> str | None:
    """The deployment ``name`` is a replica of, when it names a replica (a kept decision's
    instance, or a replica in the store) and no deployment; else None."""
    from store.tables import DeploymentRow, InstanceRow

    with Session(engine) as s:
        if s.get(DeploymentRow, name) is not None:
            return None
        got = s.exec(select(DecisionRow.deployment).where(DecisionRow.instance == name, DecisionRow.deployment != name)
                     .limit(1)).first()
        if got is None:
            row = s.get(InstanceRow, name)
            got = row.deployment if row is not None else None
        return got if got != name else None


def every(engine: Engine, batch: int = 500) -> Iterator[DecisionRow]:
    """Every decision kept, oldest first."""
    last = 0
    while True:
        with Session(engine) as s:
            rows = list(s.exec(select(DecisionRow).where(DecisionRow.id > last).order_by(DecisionRow.id).limit(batch)))
        if not rows:
            return
        yield from rows
        last = rows[-1].id


def sizes(engine: Engine) -> tuple[int, int, int]:
    """(decisions, blobs, compressed bytes of the blobs and records)."""
    with Session(engine) as s:
        n = s.exec(select(func.count()).select_from(DecisionRow)).one()
        b = s.exec(select(func.count()).select_from(DecisionBlobRow)).one()
        by = (s.exec(select(func.coalesce(func.sum(func.length(DecisionBlobRow.data)), 0))).one()
              + s.exec(select(func.coalesce(func.sum(func.length(DecisionRow.record)), 0))).one())
    return n, b, int(by)


def prune(engine: Engine, keep_days: float, now: datetime | None = None) -> tuple[int, int]:
    """Drop the decisions older than ``keep_days`` except the newest placing decision of each
    replica the store still shows, then the blobs no kept decision's manifest names; (decisions,
    blobs) dropped."""
    cutoff = (now or utcnow()) - timedelta(days=keep_days)
    with Session(engine) as s:
        live = set(s.exec(select(InstanceRow.name).where(InstanceRow.state != "deleted")))
        keep = {i for inst, i in s.exec(select(DecisionRow.instance, func.max(DecisionRow.id))
                                        .where(DecisionRow.outcome.in_(PLACING)).group_by(DecisionRow.instance))
                if inst in live}
        drop = [i for i in s.exec(select(DecisionRow.id).where(DecisionRow.at < cutoff)) if i not in keep]
        for k in range(0, len(drop), 500):
            s.exec(delete(DecisionRow).where(DecisionRow.id.in_(drop[k:k + 500])))
        s.commit()
    if not drop:
        return 0, 0
    with Session(engine) as s:
        kept = list(s.exec(select(DecisionRow.kind, DecisionRow.digest).distinct()))
    named: set[str] = set()
    for kind, d in kept:
        if kind not in MANIFESTS:
            named.add(d)
            continue
        named.add(d)
        try:
            named |= _manifest_names(blob(engine, d))
        except KeyError:
            pass
    gone = 0
    with Session(engine) as s:
        stored = list(s.exec(select(DecisionBlobRow.digest)))
        unnamed = [d for d in stored if d not in named]
        for k in range(0, len(unnamed), 500):
            s.exec(delete(DecisionBlobRow).where(DecisionBlobRow.digest.in_(unnamed[k:k + 500])))
        s.commit()
        gone = len(unnamed)
    return len(drop), gone


def _manifest_names(manifest: bytes) -> set[str]:
    """The digests a manifest names (activities/decision_inputs.py: lists of chunk digests and
    single blob digests; ``names`` are replicas, not digests)."""
    out: set[str] = set()
    for k, v in json.loads(manifest).items():
        if k == "names":
            continue
        for x in v if isinstance(v, list) else [v]:
            if isinstance(x, str) and len(x) == 64:
                out.add(x)
    return out
