"""Placing replicas in batches (the ``place_replica`` activity: workflows/place_steps.py).

The calls that arrive while one batch is placed are placed together when it ends (activities/batch.py),
in one pass:
- the store is read once: the owners of each model the batch names (for tenancy), and the
  snapshot's changes (SnapshotCache.sync);
- the policy decides each replica in arrival order, under the decision lock, each seeing the
  placements handed out before it (SnapshotCache.assume);
- the plans that place their replica outright are booked in one transaction
  (ledger.reserve_many): one write turn and one commit for the batch.

A call that finds nothing under way starts a batch of one at once. In a burst, each replica paid
its own refresh, its own transaction and its own commit; at 100 hosts and 1,500 replicas those were
about a fifth of the control plane's CPU time. Correctness is the ledger's, as before: a plan the
ledger refuses (the capacity moved under another control-plane worker) is decided again by its
caller, in a later batch, at most PLACE_TRIES times. An instance that is not one its deployment wants
is refused by the ledger too (ledger.NotWanted): its call fails with that, for good."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.engine import Engine

from activities.batch import Batch
from activities.decider import Decider
from activities.runner import Runner
from contracts.control import EstimateRecord, PlaceResult, RequestSummary, ReserveResult
from store import ledger
from store.booking_proofs import BookingSigner
from scheduler.errors import GpuflowError
from scheduler.request import Request
from scheduler.spec import ModelSpec
from scheduler.summary import request_summary, summary_text

MAX_PLACE_BATCH = 64  # replicas decided and booked in one pass


@dataclass(frozen=True)
class Placing:
    """One place_replica call in a batch, its spec validated and costed."""

    instance: str
    spec: ModelSpec
    request: Request  # what it claims (costed before it asked)
    then: str  # the state its booking records: scheduled, or starting (its launch follows at once)


def place_batches(decider: Decider, engine: Engine, runner: Runner) -> Batch[Placing, PlaceResult | None]:
    """The batches the place activity's calls join: each is placed by place_many in ``runner``'s pool."""
    signer = BookingSigner()
    return Batch(lambda asks: runner.submit(place_many, decider, engine, asks, signer), MAX_PLACE_BATCH)


def place_many(decider: Decider, engine: Engine, asks: list[Placing],
               signer: BookingSigner | None = None) -> list[PlaceResult | None | GpuflowError]:
    """For each ask, in order: its result (booked, or a decision that does not place it outright),
    None when the ledger refused its plan (decide again), or the GpuflowError the policy raised
    for its spec (or the ledger's NotWanted). ``decider`` decides (under its lock) and hears of refused plans; ``engine``
    is the store the batch is booked in; ``signer`` signs each booking on one host for its host
    (store/booking_proofs.py: its first launch's booking check, without the host workflow)."""
    decided = decider.decide_many([(a.instance, a.spec, a.request) for a in asks])
    out: list[PlaceResult | None | GpuflowError] = []
    books: list[tuple[int, ledger.Booking]] = []
    for a, d in zip(asks, decided):
        if isinstance(d, GpuflowError):
            out.append(d)
            continue
        s = request_summary(a.request)
        est = EstimateRecord(model=a.spec.name, request=RequestSummary.model_validate(s), summary=summary_text(s))
        out.append(PlaceResult(decision=d, estimate=est))
        if d.places_outright:
            recorded = d.booked_row(est.summary)  # the row's summary of the decision (InstanceRecord.decision)
            reason = "" if a.then == "starting" else f"{d.strategy}: score {d.score}"
            books.append((len(out) - 1, ledger.Booking(a.instance, d.plan, reason, recorded, a.then,
                                                       a.spec.backend.value)))
    if books:
        got = ledger.reserve_many(engine, [b for _, b in books])
        for (i, b), g in zip(books, got):
            if isinstance(g, ledger.StaleDecision):
                decider.refused(b.instance)
                out[i] = None
            elif isinstance(g, ledger.NotWanted):
                decider.snapshots.forget(b.instance)  # not booked: no longer assumed taken
                out[i] = g
            else:
                plan, now = g
                out[i] = out[i].model_copy(update={"booked": ReserveResult(plan=plan, booked_now=now)})
        if signer is not None:
            done = [(b.instance, out[i].booked.plan, b.backend) for i, b in books if isinstance(out[i], PlaceResult)]
            proofs = signer.sign(engine, done)
            for i, b in books:
                if b.instance in proofs:
                    out[i] = out[i].model_copy(update={"proof": proofs[b.instance]})
    return out
