"""The bookings the control plane signs for their hosts (contracts/booking_proof.py, issue 37):
made by the place activity right after its batch is booked (activities/place_batch.py), so a
replica's first launch needs no ``booking`` update on its host's workflow.

Only a placement on one host gets one (a placement across several hosts asks the ledger from each
host, as before), and only where the store holds that host's credential. Each host's key is made
from the cluster's private key and the host's joined public key (store/engine_keys.py host_keys)
and kept HOST_KEY_S in this process: a host that joined again since gets, for that long, proofs
its agent refuses, and its launches ask the ledger as before: slower, never looser."""

from __future__ import annotations

import time

from sqlalchemy.engine import Engine

from contracts import booking_proof
from contracts.booking_proof import BookingProof
from contracts.decision import PlacementPlan
from store.bookings import booked_by
from store.engine_keys import host_keys

HOST_KEY_S = 60.0  # how long a host's key is kept before it is made again from the store


class BookingSigner:
    """Signs bookings with each host's key, kept a while (one per control-plane worker)."""

    def __init__(self, clock=time.time):
        self.clock = clock
        self.keys: dict[str, tuple[float, bytes | None]] = {}

    def _keys(self, engine: Engine, workers: set[str], now: float) -> dict[str, bytes | None]:
        stale = sorted(w for w in workers if w not in self.keys or now - self.keys[w][0] > HOST_KEY_S)
        if stale:
            for w, k in host_keys(engine, stale).items():
                self.keys[w] = (now, k)
        return {w: self.keys[w][1] for w in workers}

    def sign(self, engine: Engine, booked: list[tuple[str, PlacementPlan, str | None]]) -> dict[str, BookingProof]:
        """instance -> the proof of its booking on its one host, for each (instance, plan, backend)
        just booked whose plan uses one host that has a credential."""
        one_host = [(i, p, b) for i, p, b in booked if not p.subordinates]
        if not one_host:
            return {}
        now = self.clock()
        keys = self._keys(engine, {p.worker for _, p, _ in one_host}, now)
        return {i: booking_proof.make(keys[p.worker], i, p.worker, booked_by(i, p.worker, p, b), now)
                for i, p, b in one_host if keys[p.worker] is not None}
