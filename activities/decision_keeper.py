"""Keeps each placement decision's inputs in the store (store/decision_log.py), off the decisions'
path: ``keep`` encodes them (store/decision_codec.py: the digest goes into the record at
once) and queues the write; a thread writes what is queued in one transaction every
``every_s``, and prunes past the retention (``keep_days``) once an hour.

A write that fails is logged and dropped: a decision never waits on, or fails for, its audit copy
(``gpuflow explain --replay`` then says the inputs were not kept). With ``metrics``
(ControlMetrics), the control plane's gpuflow_decision_inputs_* series count what keeping costs
(bench/bench_fleet.py prints them)."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import zlib

from sqlalchemy.engine import Engine

from contracts.decision import DecisionRecord
from scheduler.decision_inputs import DecisionInputs
from contracts.group_decision_of import member_record, note
from scheduler.decision import Decision
from scheduler.group_inputs import GroupInputs
from scheduler.groups.decision import GroupDecision
from store import decision_log
from store.decision_codec import Encoder

log = logging.getLogger("gpuflow.decisions")
PRUNE_EVERY_S = 3600.0


class DecisionKeeper:
    def __init__(self, engine: Engine, keep_days: float = 30.0, every_s: float = 0.2, metrics=None):
        self.engine, self.keep_days, self.every_s, self.metrics = engine, keep_days, every_s, metrics
        self.encoder = Encoder()
        self._encoding = threading.Lock()
        self._lock = threading.Condition()
        self._blobs: dict[str, bytes] = {}
        self._rows: list[tuple[DecisionRecord, str, str, str, str]] = []  # (record, digest, instance, deployment, kind)
        self._refusals: dict[str, None] = {}  # group refusals kept lately, by digest: one kept per inputs
        self._steps: list[tuple[str, str, dict, str, str]] = []  # autoscaler steps: (digest, deployment, decision, outcome, reason)
        self._busy = False
        self._stop = False
        self._pruned_at = 0.0
        self._thread = threading.Thread(target=self._run, name="decision-keeper", daemon=True)
        self._thread.start()

    def keep(self, inputs: DecisionInputs, recs: list[DecisionRecord]) -> str:
        """Encode ``inputs``, give each of ``recs`` (the records of ``inputs.names``) the digest,
        and queue them to be written; the digest."""
        t = time.perf_counter()
        with self._encoding:
            enc = self.encoder.encode(inputs)
        if self.metrics is not None:
            self.metrics.kept_encode_seconds.inc(time.perf_counter() - t)
        for r in recs:
            r.inputs = enc.digest
        with self._lock:
            self._blobs.update(enc.blobs)
            self._blobs[enc.digest] = enc.manifest
            self._rows += [(r, enc.digest, n, inputs.spec.name, "placement") for r, n in zip(recs, inputs.names)]
            self._lock.notify()
        return enc.digest

    def keep_group(self, inputs: GroupInputs, recs: dict[str, DecisionRecord]) -> str:
        """A prefill/decode group's decision (scheduler/group_inputs.py: a formation, or a member
        placed alone): its inputs encoded once, and each member's record of ``recs`` (by name,
        annotated with the group's decision: contracts/group_decision_of.py) given the digest and
        queued under the inputs' kind. A refusal on inputs already kept is not kept again (a group
        waiting to form retries on a timer); the digest."""
        with self._encoding:
            enc = self.encoder.encode_group(inputs)
        for r in recs.values():
            r.inputs = enc.digest
        with self._lock:
            if not any(r.scheduled for r in recs.values()):
                if enc.digest in self._refusals:
                    return enc.digest
                self._refusals[enc.digest] = None
                while len(self._refusals) > 1000:
                    self._refusals.pop(next(iter(self._refusals)))
            self._blobs.update(enc.blobs)
            self._blobs[enc.digest] = enc.manifest
            self._rows += [(r, enc.digest, n, inputs.spec.name, inputs.kind) for n, r in recs.items()]
            self._lock.notify()
        return enc.digest

    def keep_step(self, deployment: str, inputs: bytes, decision: dict, outcome: str, reason: str) -> str:
        """An autoscaler step (scheduler/autoscale/kept.py): its inputs as one blob, its decision
        as the record; the digest."""
        digest = hashlib.sha256(inputs).hexdigest()
        with self._lock:
            self._blobs[digest] = inputs
            self._steps.append((digest, deployment, decision, outcome, reason))
            self._lock.notify()
        return digest

    def prune(self, now=None) -> tuple[int, int]:
        """Drop what is past the retention (store/decision_log.prune); (decisions, blobs) dropped.
        A blob dropped may be one the encoder took for stored: every part is handed out again."""
        n, b = decision_log.prune(self.engine, self.keep_days, now)
        if b:
            self._forget_stored()
        if n:
            log.info("decisions: %d older than %g days pruned, %d blobs with them", n, self.keep_days, b)
        return n, b

    def _forget_stored(self) -> None:
        """The encoder hands every part out again: what it took for stored may not be."""
        with self._encoding:
            self.encoder.known.clear()

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until everything queued before now is written (tests, benches, shutdown)."""
        end = time.monotonic() + timeout
        with self._lock:
            self._lock.notify()
            while (self._rows or self._steps or self._blobs or self._busy) and time.monotonic() < end:
                self._lock.wait(0.05)

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._stop = True
            self._lock.notify()
        self._thread.join(5)

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._rows and not self._steps and not self._blobs and not self._stop:
                    self._lock.wait(self.every_s)
                if self._stop and not self._rows and not self._steps and not self._blobs:
                    return
                blobs, rows, steps = self._blobs, self._rows, self._steps
                self._blobs, self._rows, self._steps = {}, [], []
                self._busy = bool(blobs or rows or steps)
            try:
                if blobs or rows or steps:
                    self._write(blobs, rows, steps)
                if time.monotonic() - self._pruned_at > PRUNE_EVERY_S:
                    self._pruned_at = time.monotonic()
                    self.prune()
            except Exception as e:  # noqa: BLE001  (an audit copy lost is logged, never fatal)
                self._forget_stored()  # what was not written must be handed out again
                log.warning("decisions: %d not kept: %s: %s", len(rows), type(e).__name__, e)
            finally:
                with self._lock:
                    self._busy = False
                    self._lock.notify_all()
            time.sleep(self.every_s / 4)  # let a burst gather into one transaction

    def _write(self, blobs: dict[str, bytes], rows: list[tuple[DecisionRecord, str, str, str, str]],
               steps: list[tuple[str, str, dict, str, str]] = ()) -> None:
        out = [decision_log.DecisionRow(kind="autoscale", digest=digest, instance=deployment, deployment=deployment,
                                        outcome=outcome, reason=reason[:500], **_packed(json.dumps(decision).encode()))
               for digest, deployment, decision, outcome, reason in steps]
        for rec, digest, instance, deployment, kind in rows:
            out.append(decision_log.DecisionRow(kind=kind, digest=digest, instance=instance, deployment=deployment,
                                                outcome=decision_log.outcome_of(rec), reason=decision_log.reason_of(rec)[:500],
                                                **_packed(rec.model_dump_json().encode())))
        written = sum(len(r.record) for r in out) + decision_log.write(self.engine, blobs, out)
        if self.metrics is not None:
            self.metrics.kept_bytes.inc(written)
            self.metrics.kept_decisions.inc(len(out))


def keep_group_decision(keeper: DecisionKeeper | None, kept: tuple[GroupInputs, GroupDecision | Decision] | None,
                        gens: dict[str, int], recs: dict[str, DecisionRecord] | None = None) -> None:
    """A prefill/decode group's decision (activities/group_place.py): ``kept`` (what the policy saw
    and what it said) on the snapshot of ``gens``; each member's record of ``recs`` (by name: the
    records the members' workflows carry; none when the group was not placed, then each member's
    refusal is made here) given its group's decision, and, with a keeper, the inputs' digest."""
    if kept is None:
        return
    inp, out = kept
    inp.gens = dict(gens)
    if recs:
        for n, r in recs.items():
            note(r, inp, out, n)
    else:
        recs = {n: member_record(inp, out, n) for n in inp.members()}
    if keeper is not None:
        keeper.keep_group(inp, recs)


def _packed(raw: bytes) -> dict:
    """A record as kept: compressed, with the digest that names it altered (store/decision_log.record_of)."""
    return {"record": zlib.compress(raw, 6), "record_digest": decision_log.digest_of(raw)}
